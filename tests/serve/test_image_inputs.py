"""Serve's `image` field without ranks: base64 in JSON and multipart uploads become the request's image, on
/v1/images/generations, /v1/images/jobs and /v1/images/edits; bad images, and images for a model that takes none,
get a 400 naming the field; requests with other images never share a batch. The app runs in process on a ready
ServerState whose ModelInfo is a tiny pipeline's (nothing here reaches a model); the real server's images:
test_edit_serve.py."""
from __future__ import annotations

import base64
import io

import numpy as np
import pytest
from fastapi.testclient import TestClient
from PIL import Image

from meshdit.config import GenerateRequest
from meshdit.engine_settings import EngineSettings
from meshdit.input_image import MAX_IMAGE_ASPECT, MAX_IMAGE_PIXELS, MAX_IMAGE_SIDE, MIN_IMAGE_SIDE
from meshdit.models.info import ModelInfo
from meshdit.serve.app import create_app
from meshdit.serve.server_state import ServerState, ServeSettings
from meshdit.testing.tiny_models import sample_image, tiny_pipeline


def png_file(image: Image.Image) -> bytes:
    buffer = io.BytesIO()
    image.save(buffer, format="PNG")
    return buffer.getvalue()


PICTURE = png_file(sample_image(40, 56))
OTHER = png_file(sample_image(40, 56).transpose(Image.Transpose.FLIP_LEFT_RIGHT))


def app_for(pipeline: str) -> tuple[ServerState, TestClient]:
    defaults = GenerateRequest(prompt="-", height=32, width=32, num_inference_steps=2)
    state = ServerState(ServeSettings(EngineSettings("tiny"), defaults, max_queue=64))
    state.info = ModelInfo.from_pipeline(tiny_pipeline(pipeline))  # what attach() sets once the ranks loaded
    state.ready = True
    return state, TestClient(create_app(state))


@pytest.fixture(scope="module")
def edit_server():
    return app_for("kontext")


def queued(state: ServerState, answer) -> GenerateRequest:
    assert answer.status_code == 202, answer.text
    return state.queue.get(answer.json()["id"]).request


def test_json_base64_and_multipart_uploads_give_the_request_the_same_image(edit_server):
    state, client = edit_server
    expected = np.asarray(Image.open(io.BytesIO(PICTURE)).convert("RGB"))
    json_image = queued(state, client.post("/v1/images/jobs", json={"prompt": "a cat", "image": b64(PICTURE)})).image
    data_url = queued(state, client.post("/v1/images/jobs", json={
        "prompt": "a cat", "image": "data:image/png;base64," + b64(PICTURE)})).image
    form = queued(state, client.post("/v1/images/jobs", data={"prompt": "a cat", "n": "1", "seed": "5"},
                                     files={"image": ("cat.png", PICTURE, "image/png")}))
    for image in (json_image, data_url, form.image):
        assert np.array_equal(np.asarray(image), expected)
    assert form.seed == 5 and form.num_images_per_prompt == 1  # form fields typed as the JSON body's
    text_alone = queued(state, client.post("/v1/images/jobs", json={"prompt": "a cat"}))
    assert text_alone.image is None  # FLUX.1 Kontext also draws from text alone


def test_requests_with_other_images_never_share_a_batch(edit_server):
    state, client = edit_server
    keys = [state.queue.get(client.post("/v1/images/jobs", json=body).json()["id"]).batch_key for body in (
        {"prompt": "a", "image": b64(PICTURE)}, {"prompt": "b", "image": b64(PICTURE)},
        {"prompt": "c", "image": b64(OTHER)}, {"prompt": "d"})]
    assert keys[0] == keys[1]  # the same image: may share a batch
    assert len({keys[0], keys[2], keys[3]}) == 3


def too_wide() -> bytes:
    return png_file(Image.new("RGB", (MAX_IMAGE_SIDE + 1, 1)))


def too_many_pixels() -> bytes:
    side = int(MAX_IMAGE_PIXELS ** 0.5) + 1
    return png_file(Image.new("RGB", (side, side)))


@pytest.mark.parametrize("data, message", [
    (b"not an image at all", "image: not an image file"),
    (PICTURE[:200], "image: the image file is damaged"),
    (too_wide(), f"each side must be {MIN_IMAGE_SIDE}..{MAX_IMAGE_SIDE}"),
    (too_many_pixels(), f"more than {MAX_IMAGE_PIXELS}"),
    # legal PNGs that made diffusers' edit pipelines raise on every rank, which ended `meshdit serve`: FLUX.1
    # Kontext divides by zero (1 x 1, 8192 x 1), Qwen-Image-Edit's vision encoder refuses the resized shape
    (png_file(Image.new("RGB", (1, 1))), f"the image is 1x1 pixels; each side must be {MIN_IMAGE_SIDE}.."),
    (png_file(Image.new("RGB", (8192, 1))), f"the image is 8192x1 pixels; each side must be {MIN_IMAGE_SIDE}.."),
    (png_file(Image.new("RGB", (16, 4096))), f"at most {MAX_IMAGE_ASPECT}:1 is taken"),
], ids=["not-an-image", "truncated", "too-wide", "too-many-pixels", "one-pixel", "one-row", "too-thin"])
def test_bad_images_get_400_naming_the_field(edit_server, data, message):
    _, client = edit_server
    for answer in (client.post("/v1/images/generations", json={"prompt": "a cat", "image": b64(data)}),
                   client.post("/v1/images/edits", data={"prompt": "a cat"},
                               files={"image": ("x.png", data, "image/png")})):
        assert answer.status_code == 400, answer.text
        assert answer.json()["error"]["param"] == "image"
        assert message in answer.json()["error"]["message"]


def test_malformed_image_fields_get_400(edit_server):
    _, client = edit_server
    for answer, param, message in (
            (client.post("/v1/images/jobs", json={"prompt": "a", "image": "%%%"}), "image", "not base64"),
            (client.post("/v1/images/edits", json={"prompt": "a"}), "image", "needs the image to edit"),
            (client.post("/v1/images/edits", data={"prompt": "a"}, files={"mask": ("m.png", PICTURE)}), "mask",
             "not supported"),
            (client.post("/v1/images/jobs", data={"prompt": "a", "n": "two"}, files={"image": ("c.png", PICTURE)}),
             "n", "n:")):
        assert answer.status_code == 400, answer.text
        assert answer.json()["error"]["param"] == param and message in answer.json()["error"]["message"]


def test_base64_with_line_breaks_is_taken_as_mime_allows(edit_server):
    """`base64 cat.png` (no -w 0) and Python's encodebytes break lines every 76 characters."""
    state, client = edit_server
    expected = np.asarray(Image.open(io.BytesIO(PICTURE)).convert("RGB"))
    for text in (base64.encodebytes(PICTURE).decode("ascii"), base64.encodebytes(PICTURE).decode().replace("\n", "\r\n"),
                 "data:image/png;base64," + base64.encodebytes(PICTURE).decode("ascii")):
        assert "\n" in text
        image = queued(state, client.post("/v1/images/jobs", json={"prompt": "a cat", "image": text})).image
        assert np.array_equal(np.asarray(image), expected)


def test_a_size_the_model_cannot_split_is_answered_in_the_request_s_terms(edit_server):
    state, client = edit_server
    multiple = state.info.family.pixel_multiple(state.info.transformer_config, state.info.vae_scale_factor)
    width, height = 3 * multiple, 2 * multiple + 1  # the height is no multiple of the model's patch
    answer = client.post("/v1/images/jobs", json={"prompt": "a cat", "size": f"{width}x{height}"})
    assert answer.status_code == 400 and answer.json()["error"]["param"] == "size", answer.text
    message = answer.json()["error"]["message"]
    assert "--height" not in message and "--width" not in message, message
    assert f"use size {width}x{2 * multiple} or {width}x{3 * multiple}" in message, message


@pytest.mark.parametrize("field", [{"output_type": "latent"}, {"response_format": "latent"}])
def test_latent_output_is_refused_not_answered_with_pixels(edit_server, field):
    _, client = edit_server
    answer = client.post("/v1/images/generations", json={"prompt": "a cat", **field})
    assert answer.status_code == 400 and answer.json()["error"]["param"] == next(iter(field)), answer.text


def test_deleting_a_running_job_answers_cancelling_until_it_stops(edit_server):
    state, client = edit_server
    job_id = client.post("/v1/images/jobs", json={"prompt": "a cat", "size": "48x32"}).json()["id"]
    batch = []
    while not any(job.id == job_id for job in batch):  # what the rank loop does: the job starts running
        batch = state.queue.next_batch(timeout=1)
    answer = client.delete(f"/v1/images/jobs/{job_id}")
    assert answer.status_code == 200 and answer.json()["status"] == "cancelling", answer.text
    assert client.get(f"/v1/images/jobs/{job_id}").json()["status"] == "cancelling"
    state.stopped(batch, 1)  # the ranks stopped at the next step boundary
    assert client.get(f"/v1/images/jobs/{job_id}").json()["status"] == "cancelled"


def test_a_model_that_takes_no_image_refuses_one_with_400():
    _, client = app_for("flux")
    answer = client.post("/v1/images/edits", files={"image": ("cat.png", PICTURE)}, data={"prompt": "a cat"})
    assert answer.status_code == 400 and answer.json()["error"]["param"] == "image"
    assert "FluxPipeline makes images from text alone and takes no image" in answer.json()["error"]["message"]
    assert "/v1/images/generations" in answer.json()["error"]["message"]
    answer = client.post("/v1/images/generations", json={"prompt": "a cat", "image": b64(PICTURE)})
    assert answer.status_code == 400 and "drop `image`" in answer.json()["error"]["message"]


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")
