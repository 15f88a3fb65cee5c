"""`meshdit generate --lora` through the CLI: PipeFusion 2 with lean loading (each stage reads only its blocks'
weights and adapter tensors) equals the serial run with the same adapter; the stage cut ignores adapters."""
import os
import subprocess
import sys
from pathlib import Path

import numpy as np

from meshdit.testing.tiny_lora import save_tiny_lora

ROOT = Path(__file__).resolve().parents[2]


def _generate(lora, out, *flags):  # the adapter's effect is tested in test_exactness
    subprocess.run([sys.executable, "-m", "meshdit", "generate", "--prompt", "a red circle", "--height", "64",
                    "--width", "64", "--steps", "2", "--seed", "4", "--lora", f"{lora}:0.8", "--output", str(out),
                    *flags], cwd=ROOT, env=dict(os.environ, PYTHONPATH=str(ROOT)), check=True, capture_output=True,
                   timeout=300)
    return np.load(out)


def test_pipefusion_lean_loading_with_lora_equals_serial(tmp_path):
    """The bundled model (3 double + 6 single blocks of nearly equal weight) with an adapter as diffusers users
    train one: peft's random init, rank 4, to_q/k/v/out.0 of every block of both lists. Each stage used to weigh
    the blocks with the adapters it held (its own blocks' only), so the two stages cut the blocks in different
    places and one block ran on neither: 0.95 (max abs) away from serial at 256² (issue 60)."""
    from diffusers import FluxPipeline

    from meshdit.default_model import weights_path

    lora = save_tiny_lora(FluxPipeline.from_pretrained(str(weights_path())), str(tmp_path / "ink.safetensors"),
                          seed=4, rank=4, scale=None)
    serial = _generate(lora, tmp_path / "serial.npy")
    staged = _generate(lora, tmp_path / "pf2.npy", "--pipefusion-parallel-degree", "2", "--warmup-steps", "2")
    assert np.array_equal(staged, serial), np.abs(staged - serial).max()


def test_an_adapter_does_not_change_a_block_s_weight_in_the_stage_cut(tmp_path):
    """What the stages cut by (block_weight) is the base block's, whichever adapters a stage loaded."""
    from meshdit.engine import Engine
    from meshdit.parallel.pipefusion import block_weight
    from meshdit.testing.tiny_models import tiny_pipeline

    pipe = tiny_pipeline("flux-4blocks")
    blocks = [*pipe.transformer.transformer_blocks, *pipe.transformer.single_transformer_blocks]
    before = [block_weight(b) for b in blocks]
    lora = save_tiny_lora("flux-4blocks", str(tmp_path / "ink.safetensors"), rank=4, scale=None)
    engine = Engine(pipe, loras={"ink": lora})
    try:
        assert sum(".lora_A." in n for n, _ in pipe.transformer.named_modules()) > 0
        assert [block_weight(b) for b in blocks] == before
    finally:
        engine.close()
