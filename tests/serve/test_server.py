"""One real 2-rank `meshdit serve` (bundled model, Ulysses 2) and many checks against it."""
from __future__ import annotations

import base64
import io
import os
import signal
import subprocess
import sys
import threading
import time

import numpy as np
import pytest
from PIL import Image

from meshdit.testing.serve_process import KEY, REPO, SMALL, Server, children

PROMPT = "two red circles on a white background"
# A batch is not bit-equal to its requests alone (tests/serve/test_engine_batching.py): at most
# one PNG level apart, on few pixels.
PNG_LEVELS = 1


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    logs = tmp_path_factory.mktemp("serve")
    srv = Server(logs, "--ulysses-degree", "2", "--max-queue", "2", *SMALL)
    # meshdit generate with the same layout and seed, started alongside (both take a while to start)
    srv.generated = logs / "generated.png"
    srv.generate = subprocess.Popen(
        [sys.executable, "-m", "meshdit", "generate", "--ulysses-degree", "2", *SMALL, "--seed", "3",
         "--prompt", PROMPT, "--output", str(srv.generated)],
        cwd=REPO, env=dict(os.environ, PYTHONPATH=str(REPO)), stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:
        yield srv.wait_ready()
    finally:
        srv.generate.kill()
        srv.stop()
        assert KEY not in srv.log.read_text(), "the API key was logged"


def png(data: bytes) -> np.ndarray:
    return np.asarray(Image.open(io.BytesIO(data)).convert("RGB"))


def test_openai_client_image_equals_meshdit_generate(server):
    import openai

    client = openai.OpenAI(base_url=server.url + "/v1", api_key=KEY)
    assert [m.id for m in client.models.list().data] == ["meshdit-default"]
    result = client.images.generate(prompt=PROMPT, size="64x64", n=1, response_format="b64_json",
                                    extra_body={"seed": 3, "steps": 4})
    served = png(base64.b64decode(result.data[0].b64_json))
    out, _ = server.generate.communicate(timeout=300)
    assert server.generate.returncode == 0, out.decode()
    np.testing.assert_array_equal(served, np.asarray(Image.open(server.generated).convert("RGB")))
    with pytest.raises(openai.BadRequestError, match="n=9"):
        client.images.generate(prompt=PROMPT, n=9)
    with pytest.raises(openai.AuthenticationError):
        openai.OpenAI(base_url=server.url + "/v1", api_key="wrong").models.list()


def test_auth_health_metrics_and_page(server):
    import httpx

    assert httpx.get(server.url + "/v1/models").status_code == 401
    assert httpx.get(server.url + "/v1/models", headers={"Authorization": "Bearer nope"}).status_code == 401
    assert server.client.get("/v1/models").status_code == 200
    health = httpx.get(server.url + "/health").json()
    assert health["status"] == "ready" and health["layout"] == "ulysses2" and health["world_size"] == 2
    metrics = httpx.get(server.url + "/metrics").text
    for name in ("meshdit_queue_length", 'meshdit_requests_total{outcome="unauthorized"}',
                 "meshdit_step_seconds_bucket", "meshdit_request_seconds_bucket"):
        assert name in metrics
    assert "<progress" in httpx.get(server.url + "/").text


BAD = [  # (body or raw bytes, content type, status, what the message must name)
    (b"{not json", "application/json", 400, "JSON"),
    (b"", "application/json", 400, "JSON"),
    (b"[1, 2]", "application/json", 400, "body"),
    (b'"a prompt"', "application/json", 400, "body"),
    ({"prompt": PROMPT}, "text/plain", 415, "Content-Type"),
    ({}, "application/json", 400, "prompt"),
    ({"prompt": ""}, "application/json", 400, "prompt"),
    ({"prompt": 42}, "application/json", 400, "prompt"),
    ({"prompt": None}, "application/json", 400, "prompt"),
    ({"prompt": PROMPT, "n": 0}, "application/json", 400, "n"),
    ({"prompt": PROMPT, "n": 10**6}, "application/json", 400, "n"),
    ({"prompt": PROMPT, "n": "2"}, "application/json", 400, "n"),
    ({"prompt": PROMPT, "n": 1.5}, "application/json", 400, "n"),
    ({"prompt": PROMPT, "size": "0x0"}, "application/json", 400, "size"),
    ({"prompt": PROMPT, "size": "big"}, "application/json", 400, "size"),
    ({"prompt": PROMPT, "size": "63x64"}, "application/json", 400, "size"),
    ({"prompt": PROMPT, "size": "99999x99999"}, "application/json", 400, "size"),
    ({"prompt": PROMPT, "steps": 0}, "application/json", 400, "steps"),
    ({"prompt": PROMPT, "steps": -3}, "application/json", 400, "steps"),
    ({"prompt": PROMPT, "seed": -1}, "application/json", 400, "seed"),
    ({"prompt": PROMPT, "seed": "x"}, "application/json", 400, "seed"),
    ({"prompt": PROMPT, "guidance_scale": "high"}, "application/json", 400, "guidance_scale"),
    ({"prompt": PROMPT, "colour": "red"}, "application/json", 400, "colour"),
    ({"prompt": PROMPT, "response_format": "url"}, "application/json", 400, "response_format"),
    ({"prompt": "red " * 200}, "application/json", 400, "prompt is"),
    ({"prompt": "x" * 100_000}, "application/json", 400, "prompt"),
    ({"prompt": PROMPT, "negative_prompt": "blue " * 100}, "application/json", 400, "negative_prompt"),
]


def test_bad_requests_get_a_4xx_naming_the_problem_and_the_server_keeps_serving(server):
    import json

    for body, content_type, status, named in BAD:
        raw = body if isinstance(body, bytes) else json.dumps(body).encode()
        r = server.client.post("/v1/images/generations", content=raw, headers={"Content-Type": content_type})
        assert r.status_code == status, (body if isinstance(body, bytes) else str(body)[:80], r.text)
        assert named in r.json()["error"]["message"], (str(body)[:80], r.text)
    assert server.client.get("/v1/images/jobs/nope").status_code == 404
    assert server.client.post("/v1/images/generations", json={"prompt": PROMPT}).status_code == 200


def test_cancel_running_and_queued_jobs_queue_full_and_progress_events(server):
    running = server.job(prompt=PROMPT, steps=1000)
    server.wait_job(running["id"], lambda s: s["step"] >= 2)
    queued = [server.job(prompt=PROMPT, seed=s) for s in (1, 2)]
    full = server.client.post("/v1/images/jobs", json={"prompt": PROMPT})
    assert full.status_code == 429 and int(full.headers["Retry-After"]) >= 1
    dropped = server.client.delete(f"/v1/images/jobs/{queued[0]['id']}").json()
    assert dropped["status"] == "cancelled" and dropped["step"] == 0
    assert server.client.delete(f"/v1/images/jobs/{running['id']}").json()["status"] == "cancelling"
    stopped = server.wait_job(running["id"], lambda s: s["status"] not in ("running", "cancelling"))
    assert stopped["status"] == "cancelled" and 2 <= stopped["step"] < 1000
    # the next job runs normally on every rank, and its progress streams as server-sent events
    with server.client.stream("GET", f"/v1/images/jobs/{queued[1]['id']}/events") as events:
        seen = [line for line in events.iter_lines() if line.startswith("data:")]
    assert '"status": "done"' in seen[-1] and len(seen) >= 2
    content = server.client.get(f"/v1/images/jobs/{queued[1]['id']}/content")
    assert content.headers["content-type"] == "image/png" and png(content.content).shape == (64, 64, 3)


def test_concurrent_load_loses_nothing_and_each_image_equals_its_solo_image(server):
    """12 requests from 4 threads; queue-full answers are retried after Retry-After."""
    results, rejected, errors = {}, [], []

    def client(thread: int) -> None:
        for i in range(thread, 12, 4):
            while True:
                r = server.client.post("/v1/images/generations", json={"prompt": PROMPT, "seed": i % 4})
                if r.status_code != 429:
                    break
                rejected.append(i)
                time.sleep(min(float(r.headers["Retry-After"]), 1.0))
            if r.status_code != 200:
                errors.append(r.text)
            else:
                results[i] = png(base64.b64decode(r.json()["data"][0]["b64_json"]))

    threads = [threading.Thread(target=client, args=(t,)) for t in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors and sorted(results) == list(range(12))
    solo = {}
    for seed in range(4):  # one at a time: each runs alone
        r = server.client.post("/v1/images/generations", json={"prompt": PROMPT, "seed": seed})
        solo[seed] = png(base64.b64decode(r.json()["data"][0]["b64_json"]))
    for i, image in results.items():
        diff = np.abs(image.astype(int) - solo[i % 4].astype(int))
        assert diff.max() <= PNG_LEVELS and (diff > 0).mean() < 0.01, (i, diff.max(), (diff > 0).mean())
    metrics = server.client.get("/metrics").text
    assert "meshdit_batch_images_count" in metrics


def test_a_warning_is_one_line_of_the_server_s_log(server):
    """An unknown prompt word (the bundled model's vocabulary) warns through the server's logger, not as Python's
    two-line file:line + source warning."""
    before = len(server.log.read_text().splitlines())
    r = server.client.post("/v1/images/generations", json={"prompt": "two red zebras on a white background"})
    assert r.status_code == 200, r.text
    lines = server.log.read_text().splitlines()[before:]
    warned = [line for line in lines if "zebras" in line]
    assert len(warned) == 1 and warned[0].startswith("meshdit serve (rank 0): WARNING: UnknownWordsWarning: "), lines
    assert not [line for line in lines if "warnings.warn" in line or "_warn_unknown_words" in line], lines


def test_the_web_page_has_a_cancel_button_that_deletes_the_job(server):
    page = server.client.get("/").text
    assert 'id="cancel"' in page and 'method: "DELETE"' in page


def test_web_page_in_a_headless_browser(server):
    if not (os.path.exists("/usr/bin/chromium") and os.path.exists("/usr/bin/chromedriver")):
        pytest.skip("Debian's chromium and chromium-driver are not installed (.ci/run installs them where apt works)")
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    options = webdriver.ChromeOptions()
    options.binary_location = "/usr/bin/chromium"
    for flag in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu"):
        options.add_argument(flag)
    browser = webdriver.Chrome(service=Service("/usr/bin/chromedriver"), options=options)
    try:
        browser.get(server.url + "/")
        WebDriverWait(browser, 30).until(lambda b: "ulysses2" in b.find_element(By.ID, "layout").text)
        browser.find_element(By.ID, "key").send_keys(KEY)
        steps = browser.find_element(By.ID, "steps")
        steps.clear()
        steps.send_keys("60")  # enough steps to see the bar move on a fast machine too
        browser.find_element(By.ID, "submit").click()
        progress = browser.find_element(By.ID, "progress")
        values = set()
        WebDriverWait(browser, 240, poll_frequency=0.1).until(
            lambda b: values.add(float(progress.get_attribute("value"))) or
            b.execute_script("const i = document.getElementById('image'); return i.complete && i.naturalWidth > 0"))
        assert len([v for v in values if 0 < v < 60]) >= 2, values  # the bar advanced step by step
        assert browser.find_element(By.ID, "status").text == "done"
        steps.clear()
        steps.send_keys("1000")  # a job to cancel: Cancel DELETEs it, and it stops at the next step boundary
        browser.find_element(By.ID, "submit").click()
        WebDriverWait(browser, 120, poll_frequency=0.1).until(lambda b: float(progress.get_attribute("value")) > 0)
        browser.find_element(By.ID, "cancel").click()
        WebDriverWait(browser, 120, poll_frequency=0.1).until(
            lambda b: b.find_element(By.ID, "status").text.startswith("cancelled"))
    finally:
        browser.quit()


def test_sigterm_drains_the_running_job_fails_the_queued_and_stops_every_rank(server):
    """Last: it ends the module's server. While the running job finishes, /health says draining and new
    jobs get 503; its image stays fetchable after it finished (--drain-grace)."""
    running = server.job(prompt=PROMPT, steps=60)
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
    server.proc.send_signal(signal.SIGTERM)  # the launcher passes it on to rank 0
    health = server.wait_job(running["id"], lambda s: server.client.get("/health").status_code != 200)
    assert health["status"] == "running", health  # draining is reported at once, not after the batch
    assert server.client.get("/health").json()["status"] == "draining"
    refused = server.client.post("/v1/images/jobs", json={"prompt": PROMPT})
    assert refused.status_code == 503 and "shutting down" in refused.text, refused.text
    for t in threads:
        t.join(60)
    assert '"status": "done"' in events[-1], events[-3:]
    time.sleep(1)  # the image of a job that finished during the drain is still there
    content = server.client.get(f"/v1/images/jobs/{running['id']}/content")
    assert content.status_code == 200 and png(content.content).shape == (64, 64, 3)
    assert server.proc.wait(timeout=60) == 0
    assert queued["answer"][0] == 503 and "shutting down" in queued["answer"][1], queued
    assert children(server.proc.pid) == [] and not [p for p in ranks if os.path.exists(f"/proc/{p}")]
    assert "drained and stopped every rank" in server.log.read_text()
