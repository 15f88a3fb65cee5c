"""`meshdit serve --ray --replicas 2` on a local Ray cluster: two replicas, each a 2-rank mesh (rank 0 the Serve
replica, rank 1 a Ray actor in its placement group), behind one port. The OpenAI client's image equals
`meshdit generate`'s; a job is fetchable whichever replica answers; killing one replica's rank 1 ends each job
completed or failed naming the rank (none lost), Ray replaces the replica, and the server keeps answering."""
from __future__ import annotations

import base64
import io
import os
import signal
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

pytest.importorskip("ray.serve", reason="Ray Serve is an optional extra: pip install 'meshdit[ray]'")

from meshdit.testing.serve_process import KEY, REPO, Server  # noqa: E402

FLAGS = ["--ulysses-degree", "2", "--height", "64", "--width", "64", "--steps", "2"]
PROMPT = "two green squares on a white background"


def png(data: bytes) -> np.ndarray:
    return np.asarray(Image.open(io.BytesIO(data)).convert("RGB"))


def ray_processes(temp_dir: Path) -> list[int]:
    """Processes of the Ray cluster whose files are under temp_dir (raylet, GCS, workers)."""
    out = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if str(temp_dir).encode() in (entry / "cmdline").read_bytes():
                    out.append(int(entry.name))
            except OSError:
                pass
    return out


def rank_actor_pids() -> list[int]:
    out = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if (entry / "cmdline").read_bytes().startswith(b"ray::RankActor"):
                    out.append(int(entry.name))
            except OSError:
                pass
    return sorted(out)


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    folder = tmp_path_factory.mktemp("ray-serve")
    temp_dir = Path("/tmp") / f"ray-meshdit-{os.getpid()}"  # Ray's socket paths must stay short
    os.environ["RAY_TMPDIR"] = str(temp_dir)  # the server inherits it
    try:
        # 4 ranks on this machine's 2 cores: Ray reserves half a CPU for each
        server = Server(folder, "--ray", "--replicas", "2", "--ray-cpus-per-rank", "0.5", *FLAGS)
        try:
            yield server.wait_ready(timeout=600)
        finally:
            server.stop()
            deadline = time.monotonic() + 30
            while ray_processes(temp_dir) and time.monotonic() < deadline:
                time.sleep(0.5)
            left = ray_processes(temp_dir)
            for pid in left:
                os.kill(pid, signal.SIGKILL)
            assert not left, f"Ray processes left behind after the server stopped: {left}"
    finally:
        del os.environ["RAY_TMPDIR"]
        subprocess.run(["rm", "-rf", str(temp_dir)], check=False)


def test_the_openai_client_gets_meshdit_generates_image(server, tmp_path):
    import openai

    client = openai.OpenAI(base_url=server.url + "/v1", api_key=KEY)
    served = png(base64.b64decode(client.images.generate(prompt=PROMPT, extra_body={"seed": 3}).data[0].b64_json))
    out = tmp_path / "generated.png"
    subprocess.run([sys.executable, "-m", "meshdit", "generate", *FLAGS, "--seed", "3", "--prompt", PROMPT,
                    "--output", str(out)], cwd=REPO, env=dict(os.environ, PYTHONPATH=str(REPO)), check=True,
                   stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=300)
    assert np.array_equal(served, png(out.read_bytes()))


def test_a_job_is_fetchable_from_either_replica(server):
    job = server.job(prompt=PROMPT, seed=5)
    server.wait_job(job["id"], lambda s: s["status"] == "done")

    def fetch(path):
        return server.client.get(f"/v1/images/jobs/{job['id']}{path}")

    replicas, contents = set(), set()
    with ThreadPoolExecutor(8) as pool:  # Serve routes to the replica with fewer requests in flight
        for _ in range(10):
            for status, content in zip(pool.map(fetch, [""] * 8), pool.map(fetch, ["/content"] * 8)):
                assert status.status_code == 200 and status.json()["status"] == "done", status.text
                assert content.status_code == 200 and content.headers["content-type"] == "image/png"
                replicas |= {status.headers["x-meshdit-replica"], content.headers["x-meshdit-replica"]}
                contents.add(content.content)
            if len(replicas) == 2:
                break
    assert len(replicas) == 2, f"only {replicas} answered"
    assert len(contents) == 1  # every replica serves the same PNG


def test_a_killed_rank_loses_no_request(server):
    jobs = [server.job(prompt=PROMPT, seed=seed, steps=40) for seed in range(6)]
    deadline = time.monotonic() + 120
    while not any(server.client.get(f"/v1/images/jobs/{j['id']}").json()["status"] == "running" for j in jobs):
        assert time.monotonic() < deadline, "no job started"
        time.sleep(0.1)
    ranks = rank_actor_pids()
    assert len(ranks) == 2, ranks  # rank 1 of each replica
    os.kill(ranks[0], signal.SIGKILL)
    ends = [server.wait_job(j["id"], lambda s: s["status"] in ("done", "failed", "cancelled"), timeout=300)
            for j in jobs]
    failed = [s for s in ends if s["status"] == "failed"]
    assert all(s["status"] in ("done", "failed") for s in ends), ends
    assert failed, "the killed replica's jobs should fail"
    assert all("rank 1 of replica" in s["error"] for s in failed), failed
    deadline = time.monotonic() + 300  # Ray replaces the failed replica; every request is answered meanwhile
    while len(rank_actor_pids()) < 2 or ranks[0] in rank_actor_pids():
        assert time.monotonic() < deadline, "the replica was not replaced"
        time.sleep(1)
    after = server.client.post("/v1/images/generations", json={"prompt": PROMPT, "seed": 3})
    assert after.status_code == 200, after.text
