"""Two "nodes" on this machine: two torchrun processes with torchrun's multi-node arguments (--nnodes 2,
--node-rank 0/1, one rendezvous endpoint on loopback), each node its own host for lean loading (MESHDIT_HOST_ID).
Ulysses 2 x ring 2 (Ulysses, the innermost axis, inside a node; the ring across) and PipeFusion 2 across the
nodes give serial's image."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest

from meshdit.distributed.ports import free_port

COMMON = ["--prompt", "a red circle", "--steps", "2", "--seed", "5"]


def _run_two_nodes(tmp_path, layout: list[str], output: str) -> list[str]:
    return _torchrun_two_nodes(tmp_path, ["-m", "meshdit", "generate", *COMMON, *layout, "--output", output])


def _torchrun_two_nodes(tmp_path, program: list[str]) -> list[str]:
    port = str(free_port())
    procs = []
    for node in (0, 1):
        env = {**os.environ, "MESHDIT_HOST_ID": f"node{node}", "OMP_NUM_THREADS": "1", "TMPDIR": str(tmp_path)}
        cmd = [sys.executable, "-m", "torch.distributed.run", "--nnodes", "2", "--node-rank", str(node),
               "--nproc-per-node", "2", "--master-addr", "127.0.0.1", "--master-port", port, *program]
        procs.append(subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env))
    outs = []
    try:
        for proc in procs:
            out, err = proc.communicate(timeout=400)
            assert proc.returncode == 0, err[-3000:]
            outs.append(out)
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    return outs


@pytest.fixture(scope="module")
def serial_image(tmp_path_factory):
    out = tmp_path_factory.mktemp("serial") / "serial.npy"
    proc = subprocess.run([sys.executable, "-m", "meshdit", "generate", *COMMON, "--output", str(out)],
                          capture_output=True, text=True, timeout=300, env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert proc.returncode == 0, proc.stderr
    return np.load(out)


@pytest.mark.parametrize("layout, described", [
    (["--ulysses-degree", "2", "--ring-degree", "2"], "layout ring2 x ulysses2 on 4 rank(s)"),
    (["--pipefusion-parallel-degree", "2", "--ulysses-degree", "2", "--warmup-steps", "2"],
     "layout pp2 x ulysses2 on 4 rank(s)"),
])
def test_two_nodes_give_serials_image(tmp_path, serial_image, layout, described):
    out = tmp_path / "two-nodes.npy"
    outs = _run_two_nodes(tmp_path, layout, str(out))
    assert described in outs[0]  # node 0 holds rank 0, the output rank
    assert np.abs(np.load(out) - serial_image).max() <= 1e-5


def test_lean_loading_has_one_reader_per_node(tmp_path):
    """host_groups (the loaders' one reader per host) follows MESHDIT_HOST_ID: two groups of two ranks."""
    _torchrun_two_nodes(tmp_path, [os.path.join(os.path.dirname(__file__), "host_groups_job.py"), str(tmp_path)])
    groups = {}
    for rank in range(4):
        with open(tmp_path / f"rank{rank}.json") as f:
            data = json.load(f)
        groups[rank] = (data["host"], data["members"])
    assert groups == {0: ("node0", [0, 1]), 1: ("node0", [0, 1]), 2: ("node1", [2, 3]), 3: ("node1", [2, 3])}


def test_the_innermost_axis_stays_inside_a_node():
    """Ranks 0, 1 on node 0 and 2, 3 on node 1 (torchrun numbers nodes' ranks contiguously): Ulysses groups are
    {0, 1} and {2, 3}, ring groups {0, 2} and {1, 3}; the planner puts the same axis on the same link."""
    from meshdit.mesh_axes import MeshAxis
    from meshdit.planner.hardware import PRESETS
    from meshdit.planner.layouts import Layout
    from meshdit.planner.predict import axis_link

    from meshdit.config import ParallelConfig
    from meshdit.mesh_axes import MESH_AXES

    config = ParallelConfig(ring_degree=2, ulysses_degree=2)
    degrees = config.degrees
    # the rank grid as mesh.py lays it out: DeviceMesh dims in MESH_AXES' order, the last varying fastest
    ranks = np.arange(config.world_size).reshape([degrees[a] for a in MESH_AXES])

    def groups(axis):
        return np.moveaxis(ranks, MESH_AXES.index(axis), -1).reshape(-1, degrees[axis]).tolist()

    ulysses_groups, ring_groups = groups(MeshAxis.ULYSSES), groups(MeshAxis.RING)
    node = {0: 0, 1: 0, 2: 1, 3: 1}
    assert all(len({node[r] for r in g}) == 1 for g in ulysses_groups)
    assert all(len({node[r] for r in g}) == 2 for g in ring_groups)
    world = PRESETS["h100-sxm"].with_size(2, nodes=2)
    layout = Layout(tuple(degrees.items()))
    assert axis_link(layout, MeshAxis.ULYSSES, world) is world.intra
    assert axis_link(layout, MeshAxis.RING, world) is world.inter
