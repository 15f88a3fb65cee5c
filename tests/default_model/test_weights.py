"""The committed default model: size, offline loading with plain diffusers, a tiny run."""

import os

import numpy as np
import pytest
import torch

from meshdit import default_model as M
from default_model import dataset as D
from default_model import evaluate as E

WEIGHTS = M.weights_path()
needs_weights = pytest.mark.skipif(not (WEIGHTS / "model_index.json").exists(), reason="weights not present")


def test_weights_folder_is_small():
    assert (WEIGHTS / "model_index.json").exists()
    total = sum(f.stat().st_size for f in WEIGHTS.rglob("*") if f.is_file())
    assert total <= 20 * 1024 * 1024, f"{total / 2**20:.1f} MiB"


@pytest.fixture(scope="module")
def pipe():
    from diffusers import FluxPipeline

    old = {k: os.environ.get(k) for k in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE")}
    os.environ.update(HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1")
    try:
        p = FluxPipeline.from_pretrained(WEIGHTS)
    finally:
        for k, v in old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
    p.set_progress_bar_config(disable=True)
    return p


@needs_weights
def test_loads_offline_as_plain_flux_pipeline(pipe):
    from diffusers import FluxPipeline, FluxTransformer2DModel

    assert type(pipe) is FluxPipeline
    assert isinstance(pipe.transformer, FluxTransformer2DModel)
    assert pipe.transformer.config.in_channels == 4 * pipe.vae.config.latent_channels
    assert pipe.vae_scale_factor == 8


@needs_weights
@pytest.mark.parametrize("size", [(256, 256), (192, 320)])
def test_two_step_generation_runs(pipe, size):
    h, w = size
    kw = M.generation_kwargs() | dict(height=h, width=w, num_inference_steps=2)
    out = pipe(D.EVAL_PROMPTS[0], generator=torch.Generator().manual_seed(0), output_type="np", **kw).images
    assert out.shape == (1, h, w, 3)
    assert np.isfinite(out).all() and out.std() > 0.01


@needs_weights
def test_default_settings_get_background_colour_count_and_position_right(pipe):
    # A small quality regression check on what the current model does on every held-out
    # prompt (100 % each); the full score, shapes included, comes from
    # `python -m default_model.evaluate` (see weights/README.md).
    prompts = D.EVAL_PROMPTS[::11]  # 6 held-out prompts: every layout but one
    right = 0
    for i, p in enumerate(prompts):
        img = pipe(p, generator=torch.Generator().manual_seed(i), output_type="np", **M.generation_kwargs()).images[0]
        want, got = D.parse_prompt(p), E.analyse(img)
        right += (got.background, got.colour, got.count, got.position) == (
            want.background, want.colour, want.count, want.position)  # position None for groups
    assert right >= 5, f"{right}/{len(prompts)}"


@needs_weights
def test_vae_round_trip_keeps_ground_truth_images_passing():
    # The VAE bounds the score: what it encodes and decodes must still pass the evaluator.
    assert E.check_vae(str(WEIGHTS), n=8) == 1.0


@needs_weights
def test_saved_tokenizers_match_the_code_that_trained_the_model(pipe):
    # The caption embeddings used in training come from components.clip_tokenizer /
    # t5_tokenizer; the saved ones must give the same ids (a tokenizer whose ids vary
    # between processes once broke prompt following silently).
    import json

    from default_model import components as C

    grammar = json.loads((WEIGHTS / "vocabulary.json").read_text())["grammar"]  # what the weights were trained on
    clip, t5 = C.clip_tokenizer(grammar), C.t5_tokenizer(grammar)
    for prompt in D.EVAL_PROMPTS[:10] + ("",):
        assert pipe.tokenizer(prompt).input_ids == clip(prompt).input_ids
        assert pipe.tokenizer_2(prompt).input_ids == t5(prompt).input_ids
    assert pipe.text_encoder.config.vocab_size == len(clip)
