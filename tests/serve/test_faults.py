"""A rank killed mid-job, and SIGTERM: each on its own 2-rank server (started together, to share the wait)."""
from __future__ import annotations

import os
import signal
import threading
import time

import pytest

from meshdit.testing.serve_process import SMALL, Server, children

PROMPT = "two red circles on a white background"


@pytest.fixture(scope="module")
def servers(tmp_path_factory):
    logs = tmp_path_factory.mktemp("serve-faults")
    pair = [Server(logs, "--ulysses-degree", "2", *SMALL) for _ in range(2)]
    try:
        yield [s.wait_ready() for s in pair]
    finally:
        for s in pair:
            s.stop()


def test_a_killed_rank_gives_503_and_the_server_exits_non_zero_leaving_nothing(servers):
    server = servers[0]
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


def test_sigterm_drains_the_running_job_fails_the_queued_and_stops_every_rank(servers):
    server = servers[1]
    running = server.job(prompt=PROMPT, steps=12)
    server.wait_job(running["id"], lambda s: s["step"] >= 1)
    events, queued = [], {}

    def follow() -> None:  # the running job's progress stream stays open through the drain
        with server.client.stream("GET", f"/v1/images/jobs/{running['id']}/events") as stream:
            events.extend(line for line in stream.iter_lines() if line.startswith("data:"))

    def submit() -> None:
        r = server.client.post("/v1/images/generations", json={"prompt": PROMPT})
        queued["answer"] = (r.status_code, r.text)

    threads = [threading.Thread(target=follow), threading.Thread(target=submit)]
    for t in threads:
        t.start()
    server.wait_job(running["id"], lambda s: server.client.get("/health").json()["queue"] == 1)
    ranks = server.rank_pids()
    server.proc.send_signal(signal.SIGTERM)
    for t in threads:
        t.join(60)
    assert server.proc.wait(timeout=60) == 0
    assert '"status": "done"' in events[-1], events[-3:]
    assert queued["answer"][0] == 503 and "shutting down" in queued["answer"][1], queued
    assert children(server.proc.pid) == [] and not [p for p in ranks if os.path.exists(f"/proc/{p}")]
    assert "drained and stopped every rank" in server.log.read_text()


def _state(pid: int) -> bytes:
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return f.read().rsplit(b")", 1)[1].split()[0]
    except OSError:
        return b"Z"
