"""The node pack, loaded as ComfyUI loads it, against one live `meshdit serve` (the bundled model, one rank,
a LoRA adapter in its --lora-dir): each node's INPUT_TYPES and function; the image equals `meshdit generate`'s
PNG for the same settings (with and without the adapter); the job's steps reach ComfyUI's progress bar; an
interrupt cancels the server's job; each error a person can act on shows the server's own message."""
from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest
import torch
from PIL import Image

from meshdit.distributed.ports import free_port
from meshdit.testing.serve_process import KEY, REPO, SMALL, Server

from .comfy_loader import (ComfyStandIn, InterruptProcessingException, load_pack, run_node, run_workflow,
                           unload_pack)

PROMPT = "two red circles on a white background"
SEED = 3
LORA_WEIGHT = 0.8


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    """(server, {"plain": generate's PNG, "ink": generate's PNG with the adapter}) for SEED and PROMPT."""
    from diffusers import FluxPipeline

    from meshdit.default_model import weights_path
    from meshdit.testing.tiny_lora import save_tiny_lora

    folder = tmp_path_factory.mktemp("comfyui")
    (folder / "loras").mkdir()
    lora = save_tiny_lora(FluxPipeline.from_pretrained(weights_path()), str(folder / "loras" / "ink.safetensors"),
                          seed=1)
    server = Server(folder, "--lora-dir", str(folder / "loras"), *SMALL)
    env = dict(os.environ, PYTHONPATH=str(REPO))
    generate = [sys.executable, "-m", "meshdit", "generate", *SMALL, "--seed", str(SEED), "--prompt", PROMPT]
    runs = {"plain": [], "ink": ["--lora", f"{lora}:{LORA_WEIGHT}"]}
    procs = {name: subprocess.Popen([*generate, *extra, "--output", str(folder / f"{name}.png")], cwd=REPO,
                                    env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
             for name, extra in runs.items()}
    try:
        server.wait_ready()
        for name, proc in procs.items():
            out, _ = proc.communicate(timeout=600)
            assert proc.returncode == 0, out.decode()
        yield server, {name: np.asarray(Image.open(folder / f"{name}.png").convert("RGB")) for name in runs}
    finally:
        for proc in procs.values():
            proc.kill()
            proc.wait()
        server.stop()


@pytest.fixture
def comfy(monkeypatch, served):
    """ComfyUI's modules (stand-ins) in sys.modules, the pack loaded after them; MESHDIT_URL for the LoRA list."""
    stand_in = ComfyStandIn()
    for name, module in stand_in.modules().items():
        monkeypatch.setitem(sys.modules, name, module)
    monkeypatch.setenv("MESHDIT_URL", served[0].url)
    monkeypatch.setenv("MESHDIT_API_KEY", KEY)
    stand_in.pack = load_pack()
    yield stand_in
    unload_pack(stand_in.pack)


def settings(comfy, url, **changes):
    values = dict(server_url=url, api_key=KEY, seed=SEED, width=64, height=64, steps=4, guidance=-1.0, cache="none",
                  negative_prompt="")
    values.update(changes)
    return run_node(comfy.pack, "MeshditSettings", **values)[1][0]


def as_png_levels(image) -> np.ndarray:
    """An IMAGE tensor [1, H, W, 3] back to the PNG's 8-bit values."""
    return np.round(image[0].numpy() * 255).astype(np.uint8)


def test_mappings_and_input_types_as_comfyui_reads_them(comfy):
    pack = comfy.pack
    assert set(pack.NODE_CLASS_MAPPINGS) == set(pack.NODE_DISPLAY_NAME_MAPPINGS)
    assert {"MeshditSettings", "MeshditLora", "MeshditTextToImage", "MeshditImageEdit", "MeshditTextToVideo",
            "MeshditImageToVideo"} == set(pack.NODE_CLASS_MAPPINGS)
    for name, node_class in pack.NODE_CLASS_MAPPINGS.items():
        types = node_class.INPUT_TYPES()
        assert set(types) <= {"required", "optional", "hidden"} and types["required"], name
        for spec in [*types["required"].values(), *types.get("optional", {}).values()]:
            assert isinstance(spec, tuple) and isinstance(spec[0], (str, list)), (name, spec)
        assert callable(getattr(node_class, node_class.FUNCTION)), name
        assert len(node_class.RETURN_NAMES) == len(node_class.RETURN_TYPES), name
        assert node_class.CATEGORY == "meshdit"
    # the LoRA selector lists the server's adapters (/v1/models), as a combo
    assert pack.NODE_CLASS_MAPPINGS["MeshditLora"].INPUT_TYPES()["required"]["lora_name"][0] == ["ink"]


def test_text_to_image_equals_meshdit_generate_and_fills_the_progress_bar(comfy, served):
    server, generated = served
    _, (images,) = run_node(comfy.pack, "MeshditTextToImage", settings=settings(comfy, server.url), prompt=PROMPT,
                            batch_size=1)
    assert images.shape == (1, 64, 64, 3) and images.dtype.is_floating_point
    assert 0.0 <= images.min() and images.max() <= 1.0
    np.testing.assert_array_equal(as_png_levels(images), generated["plain"])
    updates = comfy.bars[-1]
    assert updates[-1] == (4, 4) and all(total == 4 for _, total in updates)
    assert [v for v, _ in updates] == sorted(v for v, _ in updates)  # the job's steps, in order


def test_lora_node_image_equals_meshdit_generate_with_the_adapter(comfy, served):
    server, generated = served
    _, (loras,) = run_node(comfy.pack, "MeshditLora", lora_name="ink", strength=LORA_WEIGHT)
    _, (images,) = run_node(comfy.pack, "MeshditTextToImage", settings=settings(comfy, server.url), prompt=PROMPT,
                            batch_size=1, loras=loras)
    assert not np.array_equal(generated["ink"], generated["plain"])
    np.testing.assert_array_equal(as_png_levels(images), generated["ink"])


def test_interrupt_cancels_the_server_job(comfy, served):
    server = served[0]
    comfy.on_update = lambda value, total: value >= 1 and comfy.interrupt()  # the user interrupts mid-run
    node_class = comfy.pack.NODE_CLASS_MAPPINGS["MeshditTextToImage"]
    node = node_class()
    with pytest.raises(InterruptProcessingException):
        node.generate(settings(comfy, server.url, steps=400), prompt=PROMPT, batch_size=1)
    assert not comfy.interrupted()  # ComfyUI's flag cleared, as its own nodes leave it
    status = server.wait_job(node.job.id, lambda s: s["status"] not in ("queued", "running", "cancelling"))
    assert status["status"] == "cancelled" and 1 <= status["step"] < 400, status


def test_interrupt_while_queued_drops_the_job(comfy, served):
    """A job waiting behind another is dropped at once (the server never runs it)."""
    server = served[0]
    busy = server.job(prompt=PROMPT, size="64x64", steps=400, seed=1)
    comfy.on_update = lambda value, total: comfy.interrupt()
    node = comfy.pack.NODE_CLASS_MAPPINGS["MeshditTextToImage"]()
    try:
        with pytest.raises(InterruptProcessingException):
            node.generate(settings(comfy, server.url, seed=2), prompt=PROMPT, batch_size=1)
        status = server.client.get(f"/v1/images/jobs/{node.job.id}").json()
        assert status["status"] == "cancelled" and status["step"] == 0, status
    finally:
        server.client.delete(f"/v1/images/jobs/{busy['id']}")
        server.wait_job(busy["id"], lambda s: s["status"] not in ("queued", "running"))


def server_message(server, path, **kwargs) -> str:
    r = server.client.post(path, **kwargs)
    assert r.status_code >= 400, r.text
    return r.json()["error"]["message"]


def test_each_error_shows_the_servers_message(comfy, served):
    import base64

    server = served[0]
    pack = comfy.pack
    error = pack.nodes.MeshditError
    red = np.zeros((1, 32, 32, 3), dtype=np.float32)
    red[..., 0] = 1.0
    image = torch.from_numpy(red)

    def fails(node, **inputs) -> str:
        with pytest.raises(error) as caught:
            run_node(pack, node, **inputs)
        return str(caught.value)

    # wrong key: the server's 401 message
    wrong = fails("MeshditTextToImage", settings=settings(comfy, server.url, api_key="wrong"), prompt=PROMPT,
                  batch_size=1)
    assert "(401)" in wrong and "missing or wrong API key" in wrong
    # a size the server refuses (too many pixels; a side the model cannot split)
    for width, height in ((2048, 2048), (72, 64)):
        shown = fails("MeshditTextToImage", settings=settings(comfy, server.url, width=width, height=height),
                      prompt=PROMPT, batch_size=1)
        expected = server_message(server, "/v1/images/jobs",
                                  json={"prompt": PROMPT, "size": f"{width}x{height}", "seed": SEED, "steps": 4})
        assert expected in shown and "size" in shown, (shown, expected)
    # an image to a model that takes none
    shown = fails("MeshditImageEdit", settings=settings(comfy, server.url), image=image, prompt=PROMPT)
    png = pack.tensors.image_to_png(image[0])
    expected = server_message(server, "/v1/images/jobs",
                              json={"prompt": PROMPT, "seed": SEED, "image": base64.b64encode(png).decode()})
    assert expected in shown and "takes no image" in shown
    # a mask, which the server's models cannot use
    shown = fails("MeshditImageEdit", settings=settings(comfy, server.url), image=image, prompt=PROMPT,
                  mask=image[..., 0])
    assert "mask: not supported" in shown
    # an adapter the server lacks
    shown = fails("MeshditTextToImage", settings=settings(comfy, server.url), prompt=PROMPT, batch_size=1,
                  loras=[{"name": "sepia", "weight": 1.0}])
    assert "no LoRA adapter named 'sepia'; it has: ink" in shown
    # no server at the URL: what to check
    down = f"http://127.0.0.1:{free_port()}"
    shown = fails("MeshditTextToImage", settings=settings(comfy, down), prompt=PROMPT, batch_size=1)
    assert f"no meshdit server answers at {down}" in shown and "meshdit serve" in shown
    # half a size is refused before any request
    assert "give both" in fails("MeshditSettings", server_url=server.url, api_key="", seed=0, width=64, height=0,
                                steps=0, guidance=-1.0, cache="none", negative_prompt="")


def test_text_to_image_workflow_runs_and_saves_meshdit_generates_image(comfy, served):
    """comfyui/workflows/text_to_image.json as ComfyUI runs it, only the server URL changed: the size and steps
    it leaves at 0 are the server's defaults (here 64x64, 4 steps), the seed and prompt meshdit generate's."""
    import json

    server, generated = served
    workflow = json.loads((REPO / "comfyui" / "workflows" / "text_to_image.json").read_text())
    for node in workflow.values():
        if node["class_type"] == "MeshditSettings":
            node["inputs"].update(server_url=server.url, api_key=KEY)
    saved = []
    run_workflow(comfy.pack, workflow, {"SaveImage": lambda images, filename_prefix: saved.append(images)})
    assert len(saved) == 1
    np.testing.assert_array_equal(as_png_levels(saved[0]), generated["plain"])
