"""meshdit's First-Block Cache against diffusers' own hook (diffusers.hooks.FirstBlockCacheConfig) on the same
pipeline and settings: the same skip mask and the same image."""
import numpy as np
import pytest
import torch

from meshdit.cache import CacheSettings
from meshdit.config import GenerateRequest
from meshdit.engine import Engine
from meshdit.testing.tiny_models import tiny_pipeline

PROMPT = "a red cat on a blue square"
SIZE = dict(height=64, width=48, num_inference_steps=6)
TEXT = 16
# diffusers' hook has no warmup and no cap on cached steps: meshdit's equivalents are 0 and "never reached"
UNCAPPED = dict(warmup=0, max_cached=10_000)


def diffusers_run(pipe, threshold: float, **call):
    """(images, {branch: cached per step}) of the diffusers pipeline with its FirstBlockCache hook."""
    from diffusers.hooks import FirstBlockCacheConfig
    from diffusers.hooks.first_block_cache import FBCHeadBlockHook

    masks: dict = {}
    original = FBCHeadBlockHook._should_compute_remaining_blocks

    def spy(hook, residual):
        compute = original(hook, residual)
        masks.setdefault(hook.state_manager.context.name, []).append(not compute)
        return compute

    pipe.transformer.enable_cache(FirstBlockCacheConfig(threshold=threshold))
    FBCHeadBlockHook._should_compute_remaining_blocks = spy
    try:
        with torch.inference_mode():
            images = pipe(prompt=PROMPT, **call, **SIZE, max_sequence_length=TEXT,
                          generator=torch.Generator("cpu").manual_seed(3), output_type="np").images
    finally:
        FBCHeadBlockHook._should_compute_remaining_blocks = original
        pipe.transformer.disable_cache()
    return images, {k: tuple(v) for k, v in masks.items()}


def meshdit_run(pipe, threshold: float, guidance: float):
    engine = Engine(pipe)
    try:
        result = engine.generate(GenerateRequest(prompt=PROMPT, **SIZE, seed=3, guidance_scale=guidance,
                                                 extra={"max_sequence_length": TEXT},
                                                 cache=CacheSettings("fbcache", threshold=threshold, **UNCAPPED)))
    finally:
        engine.close()
    return result.images, {branch: mask for (branch, _), mask in result.cache.masks.items()}


@pytest.mark.parametrize("true_cfg", [False, True], ids=["one-branch", "true-cfg"])
def test_fbcache_equals_diffusers_first_block_cache(true_cfg):
    """FLUX.1 (2 double + 2 single blocks). With true CFG the diffusers pipeline runs each branch in its own
    cache_context, so each branch decides for itself: as meshdit decides per image and branch."""
    threshold = 0.55
    call = dict(negative_prompt="", true_cfg_scale=3.0) if true_cfg else {}
    pipe = tiny_pipeline("flux-4blocks")
    pipe.set_progress_bar_config(disable=True)
    expected, expected_masks = diffusers_run(pipe, threshold, **call)
    images, masks = meshdit_run(pipe, threshold, 3.0 if true_cfg else 1.0)
    assert masks == expected_masks
    flat = [c for m in masks.values() for c in m]
    assert any(flat) and not all(flat), f"some steps cached, some computed: {masks}"
    assert np.abs(images - expected).max() <= 1e-5 * np.abs(expected).max()
