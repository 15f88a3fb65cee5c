"""A rank killed mid-job, on its own 2-rank server. (SIGTERM's drain is the last test of test_server.py.)"""
from __future__ import annotations

import os
import signal
import time

import pytest

from meshdit.testing.serve_process import SMALL, Server, children

PROMPT = "two red circles on a white background"


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    srv = Server(tmp_path_factory.mktemp("serve-faults"), "--ulysses-degree", "2", *SMALL)
    try:
        yield srv.wait_ready()
    finally:
        srv.stop()


def test_a_killed_rank_gives_503_and_the_server_exits_non_zero_leaving_nothing(server):
    job = server.job(prompt=PROMPT, steps=1000)
    server.wait_job(job["id"], lambda s: s["step"] >= 1)
    ranks = server.rank_pids()
    assert len(ranks) == 2
    os.kill(ranks[1], signal.SIGKILL)
    started = time.monotonic()
    answers = []
    while server.proc.poll() is None and time.monotonic() - started < 30:
        try:
            answers.append(server.client.get(f"/v1/images/jobs/{job['id']}", timeout=5).status_code)
        except Exception:  # noqa: BLE001 - the server going away is expected
            pass
        time.sleep(0.1)
    assert 503 in answers, answers
    server.proc.wait(timeout=30)
    assert server.proc.returncode != 0
    assert time.monotonic() - started < 30
    assert not [p for p in ranks if os.path.exists(f"/proc/{p}") and b"Z" not in _state(p)]
    assert "the mesh failed" in server.log.read_text()


def _state(pid: int) -> bytes:
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return f.read().rsplit(b")", 1)[1].split()[0]
    except OSError:
        return b"Z"
