"""LoRA the way diffusers stores it, and no NaN image with exit 0 (issue 60, items 2 and 7): a folder written by
save_lora_weights (and --lora-dir's such folders) is taken and named in the summary line with its tensor count; an
adapter with non-finite tensors is refused when it loads; an image holding NaN is never written (the earlier file
kept) nor served."""
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import load_file, save_file

from meshdit.config import GenerateRequest
from meshdit.engine import Engine
from meshdit.errors import ConfigError
from meshdit.lora_files import DIFFUSERS_WEIGHT_NAME, adapter_file, adapters_in_dir, with_second_expert
from meshdit.output import NonFiniteOutputError, save_images, save_videos
from meshdit.testing.tiny_lora import save_tiny_lora
from meshdit.testing.tiny_models import tiny_pipeline

ROOT = Path(__file__).resolve().parents[2]
REQUEST = dict(prompt="a cat", height=36, width=44, num_inference_steps=2, guidance_scale=1.0,
               extra={"max_sequence_length": 8})


def test_a_save_lora_weights_folder_is_its_pytorch_lora_weights_file(tmp_path):
    folder = tmp_path / "ink"
    file = save_tiny_lora("flux", str(folder / DIFFUSERS_WEIGHT_NAME), seed=1)
    assert adapter_file(str(folder)) == file
    request, engine, _ = with_second_expert(((str(folder), 0.5),), [])
    assert request == ((file, 0.5),) and engine == (("ink", file),)  # named by its folder
    (tmp_path / "loras").mkdir()
    os.rename(folder, tmp_path / "loras" / "ink")
    save_tiny_lora("flux", str(tmp_path / "loras" / "neon.safetensors"), seed=2)
    (tmp_path / "loras" / "stray.safetensors").mkdir()  # a folder named like a file is no adapter
    assert adapters_in_dir(str(tmp_path / "loras")) == {
        "ink": str(tmp_path / "loras" / "ink" / DIFFUSERS_WEIGHT_NAME),
        "neon": str(tmp_path / "loras" / "neon.safetensors")}


def test_an_adapter_with_nan_tensors_is_refused_when_it_loads(tmp_path):
    path = save_tiny_lora("flux", str(tmp_path / "good.safetensors"), seed=1)
    state = load_file(path)
    key = sorted(state)[0]
    state[key][0, 0] = float("nan")
    save_file(state, str(tmp_path / "nan.safetensors"))
    pipe = tiny_pipeline("flux")
    with pytest.raises(ConfigError, match=f"tensor '{key}' holds NaN or infinite values"):
        Engine(pipe, loras={"nan": str(tmp_path / "nan.safetensors")})
    assert np.isfinite(Engine(pipe).generate(GenerateRequest(**REQUEST)).images).all()  # left as it was


def test_a_weight_beyond_the_bound_is_refused_by_the_api(tmp_path):
    path = save_tiny_lora("flux", str(tmp_path / "good.safetensors"), seed=1)
    engine = Engine(tiny_pipeline("flux"), loras={"good": path})
    with pytest.raises(ConfigError, match="-100..100"):
        engine.generate(GenerateRequest(**REQUEST, loras=(("good", 1e30),)))


def test_a_nan_image_is_not_written_and_the_earlier_file_is_kept(tmp_path):
    earlier = tmp_path / "out.npy"
    earlier.write_bytes(b"earlier")
    nan = np.full((1, 8, 8, 3), np.nan, dtype=np.float32)
    for save, images, name in ((save_images, nan, "out.npy"), (save_images, nan, "new.png"),
                               (save_videos, nan[:, None], "out.npy")):
        args = (images, str(tmp_path / name)) + ((8,) if save is save_videos else ())
        with pytest.raises(NonFiniteOutputError, match="NaN or infinite values .*likely a LoRA adapter weight"):
            save(*args)
    assert earlier.read_bytes() == b"earlier" and sorted(os.listdir(tmp_path)) == ["out.npy"]


def test_serve_fails_a_batch_whose_images_hold_nan():
    """The serve result path: a 500 naming the cause instead of a 200 with a blank PNG."""
    from meshdit.serve.worker import _run

    class Result:
        images = np.full((1, 4, 4, 3), np.nan, dtype=np.float32)

    class EngineStub:
        def generate_many(self, requests, on_step=None):
            return [Result()]

    class StateStub:
        failed = finished = None

        def progress(self, batch):
            return lambda step, total: False

        def fail(self, batch, message, status):
            self.failed = (message, status)

        def finish(self, batch, results):
            self.finished = results

    class OutcomeStub:  # one rank, none raised (worker.Outcome agrees over a gloo group)
        def agree(self, failure):
            return {} if failure is None else {0: failure}

    state = StateStub()
    _run(EngineStub(), [GenerateRequest()], state, ["job"], OutcomeStub())
    assert state.finished is None and state.failed[1] == 500 and "NaN or infinite values" in state.failed[0]


def test_generate_takes_a_lora_folder_and_names_it_in_the_summary(tmp_path):
    """The README's path: an adapter for the bundled model made with save_tiny_lora into a diffusers folder, then
    `meshdit generate --lora DIR`; the summary line names it with its tensor count."""
    from diffusers import DiffusionPipeline

    from meshdit.default_model import weights_path

    pipe = DiffusionPipeline.from_pretrained(str(weights_path()))
    save_tiny_lora(pipe, str(tmp_path / "my-lora" / DIFFUSERS_WEIGHT_NAME), seed=1)
    tensors = len(load_file(str(tmp_path / "my-lora" / DIFFUSERS_WEIGHT_NAME)))
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    proc = subprocess.run([sys.executable, "-m", "meshdit", "generate", "--steps", "1", "--height", "64", "--width",
                           "64", "--lora", f"{tmp_path / 'my-lora'}:0.5", "--output", str(tmp_path / "x.png")],
                          capture_output=True, text=True, timeout=300, env=env)
    assert proc.returncode == 0, proc.stderr
    assert f"LoRA my-lora ({tensors} tensors) at weight 0.5" in proc.stdout, proc.stdout
    assert (tmp_path / "x.png").exists()
