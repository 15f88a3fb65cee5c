"""A real `meshdit serve` (Ulysses 2) on every image family's tiny edit pipeline (TinyTests.edit): the official
openai client's images.edit, a JSON request with the image in base64 and a multipart/form-data upload to
/v1/images/generations each give the PNG `meshdit generate --image` gives for the same image, prompt and seed."""
from __future__ import annotations

import base64
import io
import json
import os
import subprocess
import sys

import numpy as np
import pytest
from PIL import Image

from meshdit.testing.serve_process import KEY, REPO, Server
from meshdit.testing.tiny_models import sample_image, tiny_families

EDITS = [module.TESTS.edit for _, module in tiny_families(video=False) if module.TESTS.edit]
SIZE = "48x32"  # WxH; the input image is 56 x 40, so its tokens are not the output's
PROMPT = "a blue cat"  # at most --max-sequence-length 8 T5 tokens, or serve refuses it


def flags(name: str) -> list[str]:
    tests = next(module.TESTS for _, module in tiny_families(video=False) if module.TESTS.edit == name)
    out = ["--ulysses-degree", "2", "--height", "32", "--width", "48", "--steps", "2", "--max-sequence-length", "8"]
    if tests.guidance is not None:
        out += ["--guidance-scale", str(tests.guidance)]
    for key, value in tests.request_extra.items():  # e.g. Kontext's reference kept at its own size
        out += ["--extra", f"{key}={json.dumps(value)}"]
    return out


def pixels(png: bytes) -> np.ndarray:
    return np.asarray(Image.open(io.BytesIO(png)).convert("RGB"))


@pytest.fixture(scope="module", params=EDITS)
def served(request, tmp_path_factory, tiny_folder):
    name = request.param
    folder = tmp_path_factory.mktemp(f"edit-serve-{name}")
    sample_image(40, 56).save(folder / "input.png")
    model = ["--model", tiny_folder(name), *flags(name)]
    subprocess.run([sys.executable, "-m", "meshdit", "generate", *model, "--seed", "3", "--prompt", PROMPT,
                    "--image", str(folder / "input.png"), "--output", str(folder / "generated.png")],
                   cwd=REPO, env=dict(os.environ, PYTHONPATH=str(REPO)), check=True, stdout=subprocess.PIPE,
                   stderr=subprocess.STDOUT, timeout=600)
    server = Server(folder, *model)
    try:
        yield server.wait_ready(), folder
    finally:
        server.stop()


def test_openai_images_edit_equals_meshdit_generate(served):
    import openai

    server, folder = served
    client = openai.OpenAI(base_url=server.url + "/v1", api_key=KEY)
    with open(folder / "input.png", "rb") as image:
        result = client.images.edit(image=image, prompt=PROMPT, n=1, size=SIZE, response_format="b64_json",
                                    extra_body={"seed": 3})
    generated = pixels((folder / "generated.png").read_bytes())
    assert np.array_equal(pixels(base64.b64decode(result.data[0].b64_json)), generated)


def test_json_base64_and_multipart_requests_equal_meshdit_generate(served):
    server, folder = served
    upload = (folder / "input.png").read_bytes()
    generated = pixels((folder / "generated.png").read_bytes())
    as_json = server.client.post("/v1/images/generations", json={
        "prompt": PROMPT, "size": SIZE, "seed": 3, "image": base64.b64encode(upload).decode("ascii")})
    as_form = server.client.post("/v1/images/generations", data={"prompt": PROMPT, "size": SIZE, "seed": "3"},
                                 files={"image": ("input.png", upload, "image/png")})
    for answer in (as_json, as_form):
        assert answer.status_code == 200, answer.text
        assert np.array_equal(pixels(base64.b64decode(answer.json()["data"][0]["b64_json"])), generated)
    text_alone = server.client.post("/v1/images/generations", json={"prompt": PROMPT, "size": SIZE, "seed": 3})
    if text_alone.status_code == 200:  # a model that also draws from text alone (FLUX.1 Kontext): another image
        assert not np.array_equal(pixels(base64.b64decode(text_alone.json()["data"][0]["b64_json"])), generated)
    else:  # one that needs the image says so
        assert text_alone.status_code == 400 and text_alone.json()["error"]["param"] == "image"
