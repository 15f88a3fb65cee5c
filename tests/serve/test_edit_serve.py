"""A real `meshdit serve` (Ulysses 2) on every image family's tiny edit pipeline (TinyTests.edit): the official
openai client's images.edit, a JSON request with the image in base64 and a multipart/form-data upload to
/v1/images/generations each give the PNG `meshdit generate --image` gives for the same image, prompt and seed."""
from __future__ import annotations

import base64
import io

import numpy as np
import pytest
from PIL import Image

from meshdit.testing.serve_process import KEY
from meshdit.testing.tiny_models import tiny_families
from tests.serve.shared import edit_flags

EDITS = [module.TESTS.edit for _, module in tiny_families(video=False) if module.TESTS.edit]
SIZE = "48x32"  # WxH; the input image is 56 x 40, so its tokens are not the output's
PROMPT = "a blue cat"  # at most --max-sequence-length 8 T5 tokens, or serve refuses it


def pixels(png: bytes) -> np.ndarray:
    return np.asarray(Image.open(io.BytesIO(png)).convert("RGB"))


@pytest.fixture(params=EDITS)
def served(request, served_tiny):
    """The edit pipeline's server under Ulysses 2, with input.png and generate's generated.png (the Kontext one
    shared with tests/serve/comfyui/test_edit_node.py)."""
    return served_tiny(request.param, edit_flags(request.param, "--ulysses-degree", "2"), PROMPT, "generated.png",
                       image=True)


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
