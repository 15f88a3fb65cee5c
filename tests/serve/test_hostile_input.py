"""The HTTP app under hostile input: oversized and endless bodies, deeply nested JSON, results piling up
(the store's byte and age bounds), requests during a drain.

None of this reaches the model, so the app runs here on a ready ServerState without ranks: over a real
socket (uvicorn in a thread, as rank 0 serves it) and in process (httpx's ASGI transport, which pulls
the request body only when the app asks for it); the rank loop's part is played by calling what it
calls (next_batch, finish). The real server's drain: test_server.py's SIGTERM test.
"""
from __future__ import annotations

import asyncio
import socket
import threading
import time
from types import SimpleNamespace

import httpx
import numpy as np
import pytest

from meshdit.config import GenerateRequest
from meshdit.distributed.ports import free_port
from meshdit.engine_settings import EngineSettings
from meshdit.serve.app import create_app
from meshdit.serve.jobs import Job
from meshdit.serve.server_state import ServerState, ServeSettings, png_bytes
from meshdit.serve.worker import start_http, stop_http

LIMIT = 512 * 1024  # --max-body-bytes of these servers (a body nested 100,000 deep fits under it)


def ready_state(**settings) -> ServerState:
    defaults = GenerateRequest(prompt="-", height=64, width=64, num_inference_steps=4)
    state = ServerState(ServeSettings(EngineSettings("meshdit-default-model"), defaults, port=free_port(),
                                      max_body_bytes=LIMIT, **settings))
    state.ready = True  # what attach() sets once the ranks loaded; nothing here reaches the model
    return state


@pytest.fixture(scope="module")
def served():
    state = ready_state()
    server = start_http(state)
    try:
        yield state
    finally:
        stop_http(server)


def raw_exchange(port: int, head: bytes, body: bytes = b"", timeout: float = 10) -> bytes:
    """Sends a request head and part of a body, never the rest; returns the response, read until the server
    closes the connection."""
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as conn:
        conn.sendall(head + body)
        answer = b""
        while chunk := conn.recv(65536):  # socket.timeout here: the server is still waiting for the body
            answer += chunk
        return answer


def head(port: int, *lines: str) -> bytes:
    return "\r\n".join(["POST /v1/images/jobs HTTP/1.1", f"Host: 127.0.0.1:{port}",
                        "Content-Type: application/json", *lines, "", ""]).encode()


def test_a_declared_oversized_body_gets_413_before_a_byte_of_it_is_sent(served):
    port = served.settings.port
    answer = raw_exchange(port, head(port, "Content-Length: 50000000"))  # 50 MB promised, none sent
    assert answer.startswith(b"HTTP/1.1 413"), answer[:200]
    assert b"connection: close" in answer.lower()  # the rest of the body is never read
    assert 'outcome="rejected_too_large"} 1.0' in httpx.get(f"http://127.0.0.1:{port}/metrics").text


def test_a_chunked_body_is_cut_off_once_it_passes_the_limit(served):
    """No Content-Length: the server stops reading past the limit, without waiting for the body's end."""
    port = served.settings.port
    chunk = b"x" * 4096
    body = (b"%x\r\n" % len(chunk) + chunk + b"\r\n") * (LIMIT // len(chunk) + 1)  # the final 0-chunk never comes
    answer = raw_exchange(port, head(port, "Transfer-Encoding: chunked"), body)
    assert answer.startswith(b"HTTP/1.1 413"), answer[:200]
    assert b"--max-body-bytes" in answer and str(LIMIT).encode() in answer
    assert raw_exchange(port, head(port, f"Content-Length: {LIMIT + 1}")).startswith(b"HTTP/1.1 413")


def test_the_body_is_not_read_past_the_limit():
    """In process, a body generator records how much of it the app consumed."""
    app = create_app(ready_state())
    chunk = b" " * 1024

    async def post(consumed: list, declare: bool) -> httpx.Response:
        async def body():
            while True:  # endless
                consumed.append(len(chunk))
                yield chunk

        headers = {"Content-Type": "application/json"}
        if declare:
            headers["Content-Length"] = str(50_000_000)
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://app") as client:
            return await client.post("/v1/images/generations", content=body(), headers=headers)

    for declare, most in ((True, 0), (False, LIMIT + len(chunk))):
        consumed: list = []
        r = asyncio.run(asyncio.wait_for(post(consumed, declare), 30))
        assert r.status_code == 413, r.text
        assert "--max-body-bytes" in r.json()["error"]["message"]
        assert sum(consumed) <= most, (declare, sum(consumed))


@pytest.mark.parametrize("depth", [100_000, 2_000])
@pytest.mark.parametrize("where", ["body", "field"])
def test_deeply_nested_json_gets_400_naming_the_nesting(served, depth, where):
    nested = "[" * depth + "]" * depth
    raw = nested if where == "body" else '{"prompt": "a red circle", "user": ' + nested + "}"
    r = httpx.post(f"http://127.0.0.1:{served.settings.port}/v1/images/generations", content=raw.encode(),
                   headers={"Content-Type": "application/json"}, timeout=30)
    assert r.status_code == 400, r.text[:300]
    assert "nested" in r.json()["error"]["message"], r.text[:300]


def test_limit_flags_are_checked_before_any_rank_starts(capsys):
    from meshdit.cli import main

    for flag, value in (("--max-body-bytes", "0"), ("--result-store-mb", "0"), ("--result-ttl", "-1"),
                        ("--drain-grace", "-1"), ("--body-timeout", "0")):
        assert main(["serve", flag, value]) == 2
        assert flag in capsys.readouterr().err


# -- the result store: bounded by bytes and age ----------------------------------------------------


def finish_next(state: ServerState, seed: int) -> list:
    """What the rank loop does with the next batch once the mesh ran it: real PNGs of 64x64 noise."""
    batch = state.queue.next_batch(timeout=10)
    images = [np.random.default_rng(seed + i).random((64, 64, 3)) for i in range(len(batch))]
    state.finish(batch, [SimpleNamespace(images=[image], cache=None) for image in images])
    return batch


def submit(state: ServerState, port: int, seed: int) -> str:
    r = httpx.post(f"http://127.0.0.1:{port}/v1/images/jobs", json={"prompt": "a red circle", "seed": seed})
    assert r.status_code == 202, r.text
    return r.json()["id"]


PNG_BYTES = len(png_bytes(np.random.default_rng(0).random((64, 64, 3))))  # about each result's size


@pytest.fixture()
def store_server(monkeypatch):
    """A server whose store holds about two results, for a minute; jobs are checked as if the model allowed them."""
    state = ready_state(result_store_bytes=2 * PNG_BYTES + PNG_BYTES // 2, result_ttl=60.0)
    monkeypatch.setattr(state, "make_job", lambda body: Job(GenerateRequest(prompt=body.prompt, seed=body.seed),
                                                            (body.seed,), 1, 4))
    server = start_http(state)
    try:
        yield state
    finally:
        stop_http(server)



def test_results_expire_oldest_first_past_the_byte_bound_and_say_so(store_server):
    state, port = store_server, store_server.settings.port
    url = f"http://127.0.0.1:{port}/v1/images/jobs"
    ids = []
    for seed in range(5):
        ids.append(submit(state, port, seed))
        finish_next(state, seed)
    assert 0 < state.results.bytes <= state.settings.result_store_bytes
    statuses = [httpx.get(f"{url}/{job_id}").json() for job_id in ids]
    assert [s["status"] for s in statuses] == ["expired"] * 3 + ["done"] * 2, statuses
    assert "--result-store-mb" in statuses[0]["error"]
    gone = httpx.get(f"{url}/{ids[0]}/content")
    assert gone.status_code == 410 and "--result-store-mb" in gone.json()["error"]["message"]
    assert httpx.get(f"{url}/{ids[-1]}/content").headers["content-type"] == "image/png"
    metrics = httpx.get(f"http://127.0.0.1:{port}/metrics").text
    assert f"meshdit_result_store_bytes {float(state.results.bytes)}" in metrics
    assert 'meshdit_results_expired_total{reason="bytes"} 3.0' in metrics


def test_results_expire_with_age_and_the_status_says_so(store_server):
    state, port = store_server, store_server.settings.port
    job_id = submit(state, port, 0)
    finish_next(state, 0)
    url = f"http://127.0.0.1:{port}/v1/images/jobs/{job_id}"
    assert httpx.get(url).json()["status"] == "done"
    state.results.ttl = 0.2
    time.sleep(0.3)
    status = httpx.get(url).json()  # the lookup expires it, even without the rank loop
    assert status["status"] == "expired" and "--result-ttl" in status["error"], status
    assert httpx.get(url + "/content").status_code == 410
    assert state.results.bytes == 0
    assert 'meshdit_results_expired_total{reason="age"} 1.0' in httpx.get(f"http://127.0.0.1:{port}/metrics").text


def test_a_synchronous_answer_is_not_expired_while_waiting_and_not_kept_after(store_server):
    state, port = store_server, store_server.settings.port
    answers = {}

    def request() -> None:
        answers["r"] = httpx.post(f"http://127.0.0.1:{port}/v1/images/generations",
                                  json={"prompt": "a red circle", "seed": 7}, timeout=60)

    waiting = threading.Thread(target=request)
    waiting.start()
    deadline = time.monotonic() + 30
    while not len(state.queue) and time.monotonic() < deadline:
        time.sleep(0.01)
    state.results.max_bytes = 1  # it would expire at once, were it not waited for
    [job] = finish_next(state, 7)
    waiting.join(30)
    assert answers["r"].status_code == 200 and len(answers["r"].json()["data"]) == 1
    assert job.state == "done" and job.pngs == [] and state.results.bytes == 0


# -- the drain ---------------------------------------------------------------------------------------


def test_while_draining_new_jobs_get_503_health_says_draining_and_finished_results_wait_to_be_fetched(
        store_server):
    state, port = store_server, store_server.settings.port
    base = f"http://127.0.0.1:{port}"
    job_id = submit(state, port, 0)
    [running] = state.queue.next_batch(timeout=10)
    state.begin_drain()  # what SIGTERM does at once, while the batch runs
    refused = httpx.post(f"{base}/v1/images/jobs", json={"prompt": "a red circle"})
    assert refused.status_code == 503 and "shutting down" in refused.json()["error"]["message"]
    health = httpx.get(f"{base}/health")
    assert health.status_code == 503 and health.json()["status"] == "draining"
    state.drain()
    state.finish([running], [SimpleNamespace(images=[np.zeros((64, 64, 3))], cache=None)])
    assert not state.may_stop()  # its image was not fetched yet
    assert httpx.get(f"{base}/v1/images/jobs/{job_id}/content").status_code == 200
    assert state.may_stop()
    # one nobody fetches is kept --drain-grace seconds
    state.settings.drain_grace = 0.3
    late = Job(GenerateRequest(prompt="a red circle"), (), 1, 4)
    state.queue.jobs[late.id] = late
    late.state = "running"
    state.finish([late], [SimpleNamespace(images=[np.zeros((64, 64, 3))], cache=None)])
    assert not state.may_stop()
    time.sleep(0.4)
    assert state.may_stop()


# -- bodies that never complete, clients that leave -------------------------------------------------


@pytest.fixture()
def quick_server(monkeypatch):
    """A server whose bodies must arrive within a second; jobs are checked as if the model allowed them."""
    state = ready_state(body_timeout=1.0)
    monkeypatch.setattr(state, "make_job", lambda body: Job(GenerateRequest(prompt=body.prompt, seed=body.seed),
                                                            (body.seed,), 1, 4))
    server = start_http(state)
    try:
        yield state
    finally:
        stop_http(server)


@pytest.mark.parametrize("framing", ["content-length", "chunked"])
def test_a_body_that_never_completes_gets_408_after_the_body_timeout(quick_server, framing):
    port = quick_server.settings.port
    lines = ["Content-Length: 1000"] if framing == "content-length" else ["Transfer-Encoding: chunked"]
    part = b'{"prompt": "a re' if framing == "content-length" else b'10\r\n{"prompt": "a re\r\n'
    started = time.monotonic()
    answer = raw_exchange(port, head(port, *lines), part)  # the rest never comes
    assert answer.startswith(b"HTTP/1.1 408"), answer[:300]
    assert b"--body-timeout" in answer and b"connection: close" in answer.lower()
    assert time.monotonic() - started < 10
    assert 'outcome="rejected_timeout"} 1.0' in httpx.get(f"http://127.0.0.1:{port}/metrics").text


def test_a_synchronous_request_whose_client_leaves_is_cancelled(quick_server):
    """Queued: dropped at once; running: asked to stop at the next step boundary (the rank loop's part)."""
    state, port = quick_server, quick_server.settings.port
    body = b'{"prompt": "a red circle", "seed": 5}'
    for running in (False, True):
        conn = socket.create_connection(("127.0.0.1", port), timeout=10)
        conn.sendall(head(port, f"Content-Length: {len(body)}").replace(b"/v1/images/jobs", b"/v1/images/generations")
                     + body)
        deadline = time.monotonic() + 10
        while not len(state.queue) and time.monotonic() < deadline:
            time.sleep(0.01)
        [job] = [j for j in state.queue.jobs.values() if j.state == "queued"]
        if running:
            assert state.queue.next_batch(timeout=1) == [job]
        conn.close()  # the client leaves without waiting for its images
        while not (job.cancel_requested or job.state == "cancelled") and time.monotonic() < deadline:
            time.sleep(0.02)
        assert job.cancel_requested if running else job.state == "cancelled", (running, job.public())
    assert 'outcome="cancelled"} 1.0' in httpx.get(f"http://127.0.0.1:{port}/metrics").text
