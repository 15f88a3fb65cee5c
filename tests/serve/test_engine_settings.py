"""Every engine setting reaches serve's ranks as it reaches generate's: one EngineSettings, one rank bootstrap
(meshdit/rank.py), one pre-launch check (meshdit/prelaunch.py)."""
from __future__ import annotations

import base64
import io
import os
import subprocess
import sys

import numpy as np
from PIL import Image

from meshdit.testing.serve_process import KEY, REPO, SMALL, Server

PROMPT = "two red circles on a white background"
# The engine flags under test: bfloat16 crashed serve's own bootstrap (its dtype table was a tuple), and serve
# had no --fp8-gemm or --memory-efficient-load at all.
ENGINE_FLAGS = ["--dtype", "bfloat16", "--fp8-gemm", "--memory-efficient-load", "--ulysses-degree", "2"]


def test_serve_with_dtype_fp8_and_lean_loading_serves_generates_image(tmp_path):
    generated = tmp_path / "generated.png"
    generate = subprocess.Popen(
        [sys.executable, "-m", "meshdit", "generate", *ENGINE_FLAGS, *SMALL, "--seed", "3", "--prompt", PROMPT,
         "--output", str(generated)],
        cwd=REPO, env=dict(os.environ, PYTHONPATH=str(REPO)), stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    out, _ = generate.communicate(timeout=600)  # one at a time: both on the same 2 cores would crawl
    assert generate.returncode == 0, out.decode()
    assert "with fp8-gemm on 2 rank(s)" in out.decode()
    server = Server(tmp_path, *ENGINE_FLAGS, *SMALL)
    try:
        server.wait_ready()
        r = server.client.post("/v1/images/generations", json={"prompt": PROMPT, "size": "64x64", "seed": 3})
        assert r.status_code == 200, r.text
        served = np.asarray(Image.open(io.BytesIO(base64.b64decode(r.json()["data"][0]["b64_json"]))).convert("RGB"))
    finally:
        server.stop()
    assert server.proc.returncode == 0, server.log.read_text()
    np.testing.assert_array_equal(served, np.asarray(Image.open(generated).convert("RGB")))
    assert KEY not in server.log.read_text()


def test_engine_from_settings_applies_dtype_and_fp8():
    """The Python API's path: the dtype name and the FP8 GEMMs of EngineSettings reach the built engine."""
    import torch

    from meshdit.default_model import weights_path
    from meshdit.engine import Engine
    from meshdit.engine_settings import EngineSettings
    from meshdit.quant.fp8_linear import Fp8Linear
    from meshdit.quant.settings import Fp8Config

    engine = Engine.from_settings(EngineSettings(str(weights_path()), dtype="bfloat16", fp8=Fp8Config(gemm=True)))
    try:
        transformer = engine.pipe.transformer
        assert transformer.x_embedder.weight.dtype == torch.bfloat16  # outside the blocks: not FP8
        assert any(isinstance(m, Fp8Linear) for m in transformer.transformer_blocks[0].modules())
    finally:
        engine.close()
    assert EngineSettings.dtype_name(torch.float16) == "float16"
