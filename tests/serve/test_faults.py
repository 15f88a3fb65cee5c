"""Faults on real 2-rank servers: an error every rank raises in one request (that job fails, the mesh serves on),
an error one rank alone raises (the ranks diverged: the mesh ends, naming the rank), a rank killed mid-job (503
naming it, then exit). The errors are raised where a model's own would be (phases.py's MESHDIT_FAIL_PHASE, at the
decode). SIGTERM's drain is the last test of test_server.py."""
from __future__ import annotations

import os
import signal
import time

import pytest

from meshdit.testing.serve_process import SMALL, Server

PROMPT = "two red circles on a white background"


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    """Every rank raises in the first request it decodes, as a model's error on one input would."""
    srv = Server(tmp_path_factory.mktemp("serve-faults"), "--ulysses-degree", "2", *SMALL,
                 env={"MESHDIT_FAIL_PHASE": "decoding"})
    try:
        yield srv.wait_ready()
    finally:
        srv.stop()


def test_an_error_every_rank_raises_fails_that_job_and_the_mesh_serves_on(server):
    failed = server.client.post("/v1/images/generations", json={"prompt": PROMPT})
    assert failed.status_code == 500, failed.text
    message = failed.json()["error"]["message"]
    assert "the model failed on this request: InjectedFault: MESHDIT_FAIL_PHASE=decoding: rank 0" in message
    assert server.client.post("/v1/images/generations", json={"prompt": PROMPT}).status_code == 200
    assert server.client.get("/health").json()["status"] == "ready"
    assert "the request failed on every rank (the server keeps serving)" in server.log.read_text()


def test_a_killed_rank_gives_503_naming_it_and_the_server_exits_non_zero_leaving_nothing(server):
    job = server.job(prompt=PROMPT, steps=1000)
    server.wait_job(job["id"], lambda s: s["step"] >= 1)
    ranks = server.rank_pids()
    assert len(ranks) == 2
    os.kill(ranks[1], signal.SIGKILL)
    started = time.monotonic()
    answers = []
    while server.proc.poll() is None and time.monotonic() - started < 30:
        try:
            answers.append(server.client.get(f"/v1/images/jobs/{job['id']}", timeout=5))
        except Exception:  # noqa: BLE001 - the server going away is expected
            pass
        time.sleep(0.1)
    refusals = [a.json()["error"]["message"] for a in answers if a.status_code == 503]
    assert refusals, [a.status_code for a in answers]
    assert "rank 1 was killed by SIGKILL" in refusals[0] and "Read error" not in refusals[0], refusals[0]
    server.proc.wait(timeout=30)
    assert server.proc.returncode != 0
    assert time.monotonic() - started < 30
    assert not [p for p in ranks if os.path.exists(f"/proc/{p}") and b"Z" not in _state(p)]
    assert "the mesh failed" in server.log.read_text()


def test_an_error_one_rank_alone_raises_ends_the_mesh_naming_it(tmp_path):
    """Rank 0 waits in the decode's collective for rank 1, which waits in the outcome's: both time out
    (MESHDIT_COLLECTIVE_TIMEOUT), and the 503 names rank 1's own error."""
    srv = Server(tmp_path, "--ulysses-degree", "2", *SMALL,
                 env={"MESHDIT_FAIL_PHASE": "decoding@1", "MESHDIT_COLLECTIVE_TIMEOUT": "20"})
    try:
        srv.wait_ready()
        answer = srv.client.post("/v1/images/generations", json={"prompt": PROMPT})
        assert answer.status_code == 503, answer.text
        assert "rank 1 failed" in answer.json()["error"]["message"], answer.text
        assert "MESHDIT_FAIL_PHASE=decoding@1" in answer.json()["error"]["message"], answer.text
        assert srv.proc.wait(timeout=60) != 0
    finally:
        srv.stop()


def _state(pid: int) -> bytes:
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return f.read().rsplit(b")", 1)[1].split()[0]
    except OSError:
        return b"Z"
