"""`meshdit generate --lora` through the CLI: PipeFusion 2 with lean loading (each stage reads only its blocks'
weights and adapter tensors) equals the serial run with the same adapter."""
import os
import subprocess
import sys
from pathlib import Path

import numpy as np

from meshdit.testing.tiny_lora import save_tiny_lora
from meshdit.testing.tiny_models import tiny_pipeline

ROOT = Path(__file__).resolve().parents[2]


def _generate(model, lora, out, *flags):  # the adapter's effect is tested in test_exactness
    subprocess.run([sys.executable, "-m", "meshdit", "generate", "--model", str(model), "--prompt", "a cat",
                    "--height", "36", "--width", "44", "--steps", "2", "--max-sequence-length", "8",
                    *(["--lora", f"{lora}:0.8"] if lora else []), "--output", str(out), *flags],
                   cwd=ROOT, env=dict(os.environ, PYTHONPATH=str(ROOT)), check=True, capture_output=True, timeout=300)
    return np.load(out)


def test_pipefusion_lean_loading_with_lora_equals_serial(tmp_path):
    tiny_pipeline("flux-4blocks").save_pretrained(tmp_path / "model")
    lora = save_tiny_lora("flux-4blocks", str(tmp_path / "ink.safetensors"), seed=1)
    serial = _generate(tmp_path / "model", lora, tmp_path / "serial.npy")
    staged = _generate(tmp_path / "model", lora, tmp_path / "pf2.npy", "--pipefusion-parallel-degree", "2",
                       "--warmup-steps", "2")
    assert np.abs(staged - serial).max() <= 1e-5 * np.abs(serial).max()
