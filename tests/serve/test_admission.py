"""Admission by predicted time (serve/admission.py): the planner prices each job on this server's layout, the
price is corrected by measured batches, and --max-queue-seconds answers 429 with Retry-After when the predicted
wait exceeds it. In-process (FastAPI's TestClient, no ranks): the jobs are queued, never run."""
from __future__ import annotations

import dataclasses
import time

from fastapi.testclient import TestClient

from meshdit.default_model import weights_path
from meshdit.engine_settings import EngineSettings
from meshdit.models.info import ModelInfo
from meshdit.request import fill_defaults
from meshdit.serve.app import create_app
from meshdit.serve.server_state import ServerState, ServeSettings
from meshdit.config import GenerateRequest


def server(max_queue_seconds: float) -> tuple[ServerState, TestClient]:
    model = str(weights_path())
    info = ModelInfo.from_pretrained(model)
    defaults = fill_defaults(GenerateRequest(prompt="-"), info.request_defaults())
    state = ServerState(ServeSettings(EngineSettings(model), defaults, max_queue=64,
                                      max_queue_seconds=max_queue_seconds))
    state.info, state.ready = info, True  # what attach() sets once the ranks loaded (nothing runs here)
    state.admission.start()
    return state, TestClient(create_app(state))


def test_planner_prices_jobs_and_the_correction_follows_measured_batches():
    state, client = server(1000.0)
    small = client.post("/v1/images/jobs", json={"prompt": "a red circle", "size": "64x64", "steps": 4}).json()
    large = client.post("/v1/images/jobs", json={"prompt": "a red circle", "size": "256x256", "steps": 40}).json()
    small, large = state.queue.get(small["id"]), state.queue.get(large["id"])
    assert 0 < small.predicted_s < large.predicted_s  # 16x the tokens and 10x the steps: more work
    assert large.predicted_s == state.admission.planner_seconds(large.request)
    # a batch that took twice its prediction doubles every later prediction
    batch = state.queue.next_batch(timeout=0)
    assert batch == [small]
    small.started -= 2 * small.predicted_s
    state.queue.end(small, "done")
    state.admission.observe(batch)
    assert abs(state.admission.correction - 2.0) < 0.05
    assert abs(state.admission.seconds(large) - 2 * large.predicted_s) < 0.1 * large.predicted_s
    metrics = client.get("/metrics").text
    for name in ("meshdit_request_predicted_seconds_count 1.0", "meshdit_request_service_seconds_count 1.0",
                 "meshdit_queue_length 1.0", "meshdit_in_flight_requests 0.0", "meshdit_prediction_correction 2",
                 "meshdit_queue_predicted_seconds ", "meshdit_last_step_seconds "):
        assert name in metrics, name


def test_a_predicted_wait_past_the_limit_gets_429_with_retry_after():
    state, client = server(1.0)
    body = {"prompt": "a red circle", "size": "256x256", "steps": 20}
    one = state.admission.planner_seconds(dataclasses.replace(
        state.settings.request, height=256, width=256, num_inference_steps=20))
    state.admission.correction = 0.6 / one  # measured: such a job takes 0.6 s here, so two exceed 1 s
    first = client.post("/v1/images/jobs", json=body)
    assert first.status_code == 202, first.text  # nothing ahead: 0.6 s <= 1 s
    refused = client.post("/v1/images/jobs", json=body)
    assert refused.status_code == 429, refused.text
    assert refused.headers["Retry-After"] == "1"  # 1.2 s predicted, 0.2 s past the limit: rounded up
    assert "--max-queue-seconds" in refused.json()["error"]["message"]
    assert len(state.queue) == 1
    # a job that alone exceeds the limit still runs on an idle server (retrying could never help it)
    state.queue.fail_waiting("cleared", 503)
    alone = client.post("/v1/images/jobs", json=dict(body, steps=200))
    assert alone.status_code == 202, alone.text
    # the running batch counts for what is left of it
    batch = state.queue.next_batch(timeout=0)
    batch[0].started = time.time() - 100 * state.admission.seconds(batch[0])  # overdue: nothing left of it
    assert client.post("/v1/images/jobs", json=body).status_code == 202
    assert 'meshdit_requests_total{outcome="rejected_queue_seconds"} 1.0' in client.get("/metrics").text
