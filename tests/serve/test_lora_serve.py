"""`meshdit serve --lora-dir`: two adapters alternating over 6 requests through the openai client, each image
equal to `meshdit generate --lora` with that adapter (Ulysses 2 on both); an adapter the server lacks is a 400."""
from __future__ import annotations

import base64
import io
import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
from PIL import Image

from meshdit.testing.serve_process import KEY, REPO, Server
from meshdit.testing.tiny_lora import save_tiny_lora

FLAGS = ["--ulysses-degree", "2", "--height", "32", "--width", "48", "--steps", "2", "--max-sequence-length", "8",
         "--guidance-scale", "1"]
PROMPT = "a red cat on a blue square"
PNG_LEVELS = 1  # a batch is not bit-equal to its requests alone (tests/serve/test_engine_batching.py)


def png(data: bytes) -> np.ndarray:
    return np.asarray(Image.open(io.BytesIO(data)).convert("RGB")).astype(int)


@pytest.fixture(scope="module")
def setup(tmp_path_factory, tiny_folder):
    folder, model = tmp_path_factory.mktemp("lora-serve"), tiny_folder("flux")
    (folder / "loras").mkdir()
    paths = {name: save_tiny_lora("flux", str(folder / "loras" / f"{name}.safetensors"), seed=seed)
             for name, seed in (("ink", 1), ("neon", 2))}
    server = Server(folder, "--model", model, "--lora-dir", str(folder / "loras"), *FLAGS)
    generated = {}
    try:
        for name, path in paths.items():  # meshdit generate with the same layout, seed and adapter
            generated[name] = folder / f"{name}.png"
            subprocess.run([sys.executable, "-m", "meshdit", "generate", "--model", model, *FLAGS,
                            "--seed", "3", "--prompt", PROMPT, "--lora", f"{path}:0.8", "--output",
                            str(generated[name])], cwd=REPO, env=dict(os.environ, PYTHONPATH=str(REPO)), check=True,
                           stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=300)
        yield server.wait_ready(), {n: png(p.read_bytes()) for n, p in generated.items()}
    finally:
        server.stop()


def test_two_adapters_alternating_equal_meshdit_generate(setup):
    import openai

    server, generated = setup
    client = openai.OpenAI(base_url=server.url + "/v1", api_key=KEY)
    assert [m.id for m in client.models.list().data][1:] == ["ink", "neon"]
    names = ["ink", "neon"] * 3

    def ask(name):
        result = client.images.generate(prompt=PROMPT, n=1, response_format="b64_json",
                                        extra_body={"seed": 3, "loras": [{"name": name, "weight": 0.8}]})
        return png(base64.b64decode(result.data[0].b64_json))

    with ThreadPoolExecutor(6) as pool:  # all queued at once: equal adapters may batch, different ones never
        served = list(pool.map(ask, names))
    assert not np.array_equal(generated["ink"], generated["neon"])
    for name, image in zip(names, served):
        assert np.abs(image - generated[name]).max() <= PNG_LEVELS, name
    with pytest.raises(openai.BadRequestError, match="no LoRA adapter named 'sepia'"):
        client.images.generate(prompt=PROMPT, extra_body={"loras": [{"name": "sepia"}]})
