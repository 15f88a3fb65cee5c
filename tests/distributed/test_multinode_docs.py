"""docs/multinode.md's launch examples parse, and their arguments are the ones a 2-node x 8-GPU world needs:
torchrun's multi-node flags, degrees multiplying to the world, and meshdit generate's own flags (its parser
accepts them)."""
from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest

from meshdit.cli import build_parser

DOC = Path(__file__).resolve().parents[2] / "docs" / "multinode.md"
NODES, PER_NODE = 2, 8


def _blocks(lang: str) -> list[str]:
    return re.findall(rf"```{lang}\n(.*?)```", DOC.read_text(encoding="utf-8"), re.S)


def _check_generate(args: list[str]) -> None:
    """meshdit generate's parser takes them; the degrees multiply to the world."""
    parsed = build_parser().parse_args(["generate", *args])
    world = (parsed.ulysses_degree * parsed.ring_degree * parsed.pipefusion_parallel_degree
             * parsed.data_parallel_degree * parsed.cfg_degree)
    assert world == NODES * PER_NODE


def _torchrun(words: list[str]) -> tuple[dict, list[str]]:
    """(torchrun's options, the meshdit generate arguments after `-m meshdit generate`)."""
    start = words.index("torchrun")
    m = words.index("-m", start)
    assert words[m + 1: m + 3] == ["meshdit", "generate"]
    options, it = {}, iter(words[start + 1: m])
    for word in it:
        options[word] = next(it)
    return options, words[m + 3:]


def _words(script: str) -> list[str]:
    return shlex.split(script.replace("\\\n", " "), comments=True)


def test_torchrun_example():
    (block,) = _blocks("bash")[:1]
    options, generate = _torchrun(_words(block))
    assert options["--nnodes"] == str(NODES) and options["--nproc-per-node"] == str(PER_NODE)
    assert options["--node-rank"] == "$NODE_RANK" and options["--master-port"] == "29500"
    _check_generate(generate)


def test_slurm_example():
    script = _blocks("bash")[1]
    assert f"#SBATCH --nodes={NODES}" in script and "#SBATCH --ntasks-per-node=1" in script
    outer = _words(script)
    srun = outer[outer.index("srun"):]
    assert srun[srun.index("--nodes") + 1] == str(NODES) and srun[srun.index("--ntasks-per-node") + 1] == "1"
    inner = srun[srun.index("-c") + 1]  # the command each task runs (one torchrun per node)
    options, generate = _torchrun(_words(inner))
    assert options["--node-rank"] == "$SLURM_NODEID" and options["--nnodes"] == str(NODES)
    assert options["--nproc-per-node"] == str(PER_NODE)
    assert inner.startswith("MESHDIT_HOST_ID=$SLURMD_NODENAME ")  # one lean-loading reader per node
    _check_generate(generate)


def test_kubernetes_example():
    yaml = pytest.importorskip("yaml")
    (manifest,) = [yaml.safe_load(block) for block in _blocks("yaml")]
    assert manifest["kind"] == "PyTorchJob" and manifest["spec"]["nprocPerNode"] == str(PER_NODE)
    replicas = manifest["spec"]["pytorchReplicaSpecs"]
    assert sum(r["replicas"] for r in replicas.values()) == NODES
    for spec in replicas.values():
        (container,) = spec["template"]["spec"]["containers"]
        options, generate = _torchrun(container["command"] + container["args"])
        assert options["--nnodes"] == str(NODES) and options["--nproc-per-node"] == str(PER_NODE)
        assert container["resources"]["limits"]["nvidia.com/gpu"] == PER_NODE
        assert any(e["name"] == "MESHDIT_HOST_ID" for e in container["env"])
        _check_generate(generate)
