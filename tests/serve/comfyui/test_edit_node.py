"""The pack's Image Edit node against a live `meshdit serve` of a tiny FLUX.1 Kontext pipeline: the image
LoadImage would give for a file, edited, equals `meshdit generate --image` with that file, prompt and seed."""
from __future__ import annotations

import sys

import numpy as np
import pytest
from PIL import Image

from meshdit.testing.serve_process import KEY
from tests.serve.shared import edit_flags

from .comfy_loader import ComfyStandIn, load_pack, run_node, unload_pack

PROMPT = "a blue cat"  # at most --max-sequence-length 8 T5 tokens


@pytest.fixture
def kontext(served_tiny):
    """The tiny Kontext's server (Ulysses 2) with input.png and generate's generated.png: the one
    tests/serve/test_edit_serve.py asks for (the reference kept at its own size: the tiny model's --extra)."""
    return served_tiny("kontext", edit_flags("kontext", "--ulysses-degree", "2"), PROMPT, "generated.png", image=True)


def test_image_edit_equals_meshdit_generate_with_the_image(monkeypatch, kontext):
    server, folder = kontext
    stand_in = ComfyStandIn()
    for name, module in stand_in.modules().items():
        monkeypatch.setitem(sys.modules, name, module)
    pack = load_pack()
    try:
        _, (settings,) = run_node(pack, "MeshditSettings", server_url=server.url, api_key=KEY, seed=3, width=0,
                                  height=0, steps=0, guidance=-1.0, cache="none", negative_prompt="")
        image = pack.tensors.png_to_image((folder / "input.png").read_bytes())  # LoadImage: [1, 40, 56, 3]
        _, (edited,) = run_node(pack, "MeshditImageEdit", settings=settings, image=image, prompt=PROMPT)
        assert edited.shape == (1, 32, 48, 3)
        generated = np.asarray(Image.open(folder / "generated.png").convert("RGB"))
        np.testing.assert_array_equal(np.round(edited[0].numpy() * 255).astype(np.uint8), generated)
        assert stand_in.bars[-1][-1] == (2, 2)
    finally:
        unload_pack(pack)
