"""The job board of serve's Ray replicas (serve/ray_app.py), in process: two replicas' server states share one
JobBoard actor on a local Ray cluster, and each answers the other's jobs over HTTP (FastAPI's TestClient, no ranks):
an image job's status, its PNG once done, a DELETE carried out by its owner; a video's status and MP4, and a video
DELETE that makes its id unknown on both."""
from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

ray = pytest.importorskip("ray", reason="Ray Serve is an optional extra: pip install 'meshdit[ray]'")

from fastapi.testclient import TestClient  # noqa: E402

from meshdit.config import GenerateRequest  # noqa: E402
from meshdit.default_model import weights_path  # noqa: E402
from meshdit.engine_settings import EngineSettings  # noqa: E402
from meshdit.models.info import ModelInfo  # noqa: E402
from meshdit.request import fill_defaults  # noqa: E402
from meshdit.serve.app import create_app  # noqa: E402
from meshdit.serve.jobs import Job  # noqa: E402
from meshdit.serve.server_state import ServeSettings  # noqa: E402


@pytest.fixture(scope="module")
def replicas():
    temp_dir = Path("/tmp") / f"ray-board-{os.getpid()}"  # Ray's socket paths must stay short
    ray.init(num_cpus=1, include_dashboard=False, namespace="meshdit-board-test", _temp_dir=str(temp_dir),
             log_to_driver=False)
    try:
        from meshdit.serve.ray_app import BoardState, JobBoard

        board = JobBoard.remote()
        model = str(weights_path())
        info = ModelInfo.from_pretrained(model)
        defaults = fill_defaults(GenerateRequest(prompt="-"), info.request_defaults())
        states = []
        for name in ("a", "b"):
            state = BoardState(ServeSettings(EngineSettings(model), defaults), board, name)
            state.info, state.ready = info, True  # what attach() sets once the ranks loaded (nothing runs here)
            state.admission.start()
            states.append((state, TestClient(create_app(state))))
        yield states
    finally:
        ray.shutdown()
        subprocess.run(["rm", "-rf", str(temp_dir)], check=False)


def test_an_image_job_is_answered_and_cancelled_from_the_other_replica(replicas):
    (a, client_a), (b, client_b) = replicas
    made = client_a.post("/v1/images/jobs", json={"prompt": "a red circle", "steps": 4})
    assert made.status_code == 202, made.text
    job_id = made.json()["id"]
    assert client_b.get(f"/v1/images/jobs/{job_id}").json()["status"] == "queued"
    (job,) = a.queue.next_batch(timeout=0)  # the rank loop takes it: running
    a.progress([job])(1, 4)
    seen = client_b.get(f"/v1/images/jobs/{job_id}").json()
    assert (seen["status"], seen["step"]) == ("running", 1)
    assert client_b.delete(f"/v1/images/jobs/{job_id}").status_code == 200  # B holds no such job: the board asks A
    assert a.progress([job])(2, 4) is True  # A's next step carries the DELETE out: the batch stops
    assert client_b.get(f"/v1/images/jobs/{job_id}").json()["status"] == "cancelled"


def test_a_finished_image_is_fetched_from_the_other_replica(replicas):
    (a, client_a), (b, client_b) = replicas
    job_id = client_a.post("/v1/images/jobs", json={"prompt": "a blue square", "steps": 4}).json()["id"]
    (job,) = a.queue.next_batch(timeout=0)
    job.pngs = [b"\x89PNG the image"]
    a.queue.end(job, "done")
    content = client_b.get(f"/v1/images/jobs/{job_id}/content")
    assert content.status_code == 200 and content.content == b"\x89PNG the image"
    assert client_b.get("/v1/images/jobs/img-unknown").status_code == 404


def test_a_video_is_answered_and_deleted_from_the_other_replica(replicas):
    (a, client_a), (b, client_b) = replicas
    request = GenerateRequest(prompt="a red cat", num_frames=9, fps=8, height=64, width=64)
    job = Job(request=request, batch_key=("video",), num_images=1, steps=4, id="video_" + "0" * 24)
    a.queue.submit(job)
    seen = client_b.get(f"/v1/videos/{job.id}").json()
    assert (seen["status"], seen["num_frames"], seen["size"]) == ("queued", 9, "64x64")
    assert client_b.get(f"/v1/videos/{job.id}/content").status_code == 409  # not completed yet
    assert client_b.delete(f"/v1/videos/{job.id}").json()["deleted"] is True
    assert a.queue.next_batch(timeout=0) == []  # A carries the DELETE out before it would run the job
    assert a.queue.get(job.id) is None
    assert client_a.get(f"/v1/videos/{job.id}").status_code == 404
    assert client_b.get(f"/v1/videos/{job.id}").status_code == 404
