"""The pack's video nodes, loaded as ComfyUI loads them, against a live `meshdit serve` of tiny video pipelines
(POST /v1/videos, OpenAI's Videos API): Text to Video on the tiny Wan and Image to Video on the tiny LTX-Video
image-to-video model give the MP4 `meshdit generate` writes for the same settings, byte for byte, and its frames
as ComfyUI's IMAGE; the job's steps reach the progress bar; an interrupt cancels the server's job; an image to
a text-to-video model shows the server's message."""
from __future__ import annotations

import sys
import time
from pathlib import Path

import numpy as np
import pytest

from meshdit.testing.serve_process import KEY

from .comfy_loader import ComfyStandIn, InterruptProcessingException, load_pack, run_node, unload_pack

PROMPT = "a red cat walks"
SEED = 3
T2V = ["--height", "64", "--width", "64", "--steps", "2", "--num-frames", "9"]  # tiny Wan: 16 fps
I2V = ["--height", "64", "--width", "96", "--steps", "2", "--num-frames", "9"]  # tiny LTX: 32-pixel tokens, 25 fps


@pytest.fixture
def wan(served_tiny):
    """The tiny Wan's server and generate's generated.mp4 (shared with tests/serve/test_video_serve.py)."""
    return served_tiny("wan", T2V, PROMPT, "generated.mp4")


@pytest.fixture
def comfy(monkeypatch, tmp_path):
    stand_in = ComfyStandIn()
    for name, module in stand_in.modules().items():
        monkeypatch.setitem(sys.modules, name, module)
    monkeypatch.setenv("MESHDIT_COMFY_OUTPUT", str(tmp_path))  # ComfyUI's output folder, outside ComfyUI
    stand_in.output = tmp_path
    stand_in.pack = load_pack()
    yield stand_in
    unload_pack(stand_in.pack)


def settings(comfy, url, **changes):
    values = dict(server_url=url, api_key=KEY, seed=SEED, width=0, height=0, steps=0, guidance=-1.0, cache="none",
                  negative_prompt="")
    values.update(changes)
    return run_node(comfy.pack, "MeshditSettings", **values)[1][0]


def cancelled_count(server) -> float:
    for line in server.client.get("/metrics").text.splitlines():
        if line.startswith('meshdit_requests_total{outcome="cancelled"}'):
            return float(line.split()[1])
    return 0.0


def test_text_to_video_equals_meshdit_generate(comfy, wan):
    server, folder = wan
    _, (frames, path, fps, audio) = run_node(comfy.pack, "MeshditTextToVideo", settings=settings(comfy, server.url),
                                             prompt=PROMPT, frames=9, fps=0, filename_prefix="meshdit/clip")
    assert Path(path).parent == comfy.output / "meshdit" and Path(path).read_bytes() == \
        (folder / "generated.mp4").read_bytes()
    assert frames.shape == (9, 64, 64, 3) and 0.0 <= frames.min() and frames.max() <= 1.0
    expected, expected_fps, _ = comfy.pack.tensors.mp4_frames(str(folder / "generated.mp4"))
    assert np.array_equal(frames.numpy(), expected.numpy()) and fps == expected_fps == 16.0
    assert audio is None  # meshdit's video models make no sound
    updates = comfy.bars[-1]
    assert updates[-1][0] == updates[-1][1] and [v for v, _ in updates] == sorted(v for v, _ in updates)


def test_interrupt_cancels_the_video_job(comfy, wan):
    server, _ = wan
    before = cancelled_count(server)
    comfy.on_update = lambda value, total: value >= 1 and comfy.interrupt()
    node = comfy.pack.NODE_CLASS_MAPPINGS["MeshditTextToVideo"]()
    with pytest.raises(InterruptProcessingException):
        node.generate(settings(comfy, server.url, steps=400), prompt=PROMPT, frames=9, fps=0, filename_prefix="x")
    assert not comfy.interrupted() and not list(comfy.output.iterdir())  # nothing written
    assert server.client.get(f"/v1/videos/{node.job.id}").status_code == 404  # deleted
    deadline = time.monotonic() + 60
    while cancelled_count(server) < before + 1:  # the ranks stop at the next step boundary
        assert time.monotonic() < deadline, "the server never counted the job cancelled"
        time.sleep(0.1)


def test_lora_name_is_free_text_when_the_server_has_no_adapters(comfy, wan, monkeypatch):
    monkeypatch.setenv("MESHDIT_URL", wan[0].url)
    monkeypatch.setenv("MESHDIT_API_KEY", KEY)
    kind, options = comfy.pack.NODE_CLASS_MAPPINGS["MeshditLora"].INPUT_TYPES()["required"]["lora_name"]
    assert kind == "STRING" and "has no adapters (meshdit serve --lora-dir)" in options["tooltip"]


def test_image_to_a_text_to_video_model_shows_the_servers_message(comfy, wan):
    import torch

    server, _ = wan
    with pytest.raises(comfy.pack.client.MeshditError) as caught:
        run_node(comfy.pack, "MeshditImageToVideo", settings=settings(comfy, server.url),
                 image=torch.zeros(1, 64, 64, 3), prompt=PROMPT, frames=0, fps=0, filename_prefix="x")
    assert "(400): input_reference: this WanPipeline makes videos from text alone" in str(caught.value)
    with pytest.raises(comfy.pack.client.MeshditError, match=r"\(400\): num_frames: "):
        run_node(comfy.pack, "MeshditTextToVideo", settings=settings(comfy, server.url), prompt=PROMPT, frames=10,
                 fps=0, filename_prefix="x")


def test_image_to_video_equals_meshdit_generate_with_the_image(comfy, served_tiny):
    server, folder = served_tiny("ltx-i2v", I2V, PROMPT, "generated.mp4", image=True)
    image = comfy.pack.tensors.png_to_image((folder / "input.png").read_bytes())  # as LoadImage gives it
    _, (frames, path, fps, _) = run_node(comfy.pack, "MeshditImageToVideo", settings=settings(comfy, server.url),
                                         image=image, prompt=PROMPT, frames=0, fps=0, filename_prefix="i2v")
    assert Path(path).read_bytes() == (folder / "generated.mp4").read_bytes()
    assert frames.shape == (9, 64, 96, 3) and fps == 25.0
