"""FLUX.1 Kontext's tiny pipelines: FLUX.1's tiny components (diffusers' Kontext test uses FLUX.1's test
transformer too) in a FluxKontextPipeline."""
from __future__ import annotations

from . import GUARD_PROMPT, GUARD_SIZE, GUARD_TEXT, GuardCase, TinyTests
from .flux import diffusers_test_inputs, tiny_flux_pipeline  # noqa: F401 (the same transformer)
from .parts import sample_image, tiny_vae


def tiny_kontext_pipeline(seed: int = 0, vae_levels: int = 2, **flux):
    """vae_levels: the VAE downsamples by 2 ** (vae_levels - 1) (5: 16, so a reference at Kontext's ~1 MP training
    resolutions is about 1000 tokens)."""
    from diffusers import FluxKontextPipeline

    components = tiny_flux_pipeline(seed, **flux).components
    if vae_levels != 2:
        components["vae"] = tiny_vae(block_out_channels=(8,) * vae_levels)
    return FluxKontextPipeline(**components)


# meshdit's splits a _cp_plan lacks (tests/models/test_diffusers_guard.py): a ControlNet's residuals, split with the image
PLAN_NOT_IN_CP_PLAN = {("", "controlnet_block_samples"): "a ControlNet's per-block residuals, split with the image",
                       ("", "controlnet_single_block_samples"): "a ControlNet's single-block residuals, likewise"}

BUILDERS = {
    "kontext": tiny_kontext_pipeline,
    "kontext-4blocks": lambda seed=0: tiny_kontext_pipeline(seed, double=2, single=2),
    "kontext-distilled": lambda seed=0: tiny_kontext_pipeline(seed, guidance_embeds=True),
    "kontext-vae16": lambda seed=0: tiny_kontext_pipeline(seed, vae_levels=5),
}
# The tests' reference image keeps its own size (Kontext's training resolutions are about 1 MP: 65536 tiny tokens).
NATIVE_SIZE = {"_auto_resize": False}
TESTS = TinyTests(main="kontext", four_blocks="kontext-4blocks", edit="kontext",
                  variants=("kontext-distilled",), guidance=3.0, request_extra=NATIVE_SIZE,  # true CFG
                  tensor_parallel=())  # FLUX.1's transformer: its builds test it
# A reference of another size than the output (40 x 56 pixels: 10 x 14 tokens, beside 16 x 12 noise tokens).
_REFERENCE = sample_image(40, 56)
_SIZE = GUARD_SIZE["height"] * GUARD_SIZE["width"]  # the pipeline rescales height and width to max_area
GUARD_CASES = {
    "kontext": GuardCase("kontext-distilled", dict(
        image=_REFERENCE, prompt=GUARD_PROMPT, guidance_scale=3.5, max_sequence_length=GUARD_TEXT, max_area=_SIZE,
        _auto_resize=False), 3.5, NATIVE_SIZE),
    "kontext-true-cfg": GuardCase("kontext", dict(
        image=_REFERENCE, prompt=GUARD_PROMPT, negative_prompt="", true_cfg_scale=3.0,
        max_sequence_length=GUARD_TEXT, max_area=_SIZE, _auto_resize=False), 3.0, NATIVE_SIZE),
    # the pipeline's default: the reference resized to the training resolution nearest its aspect (56 / 40: 1184 x 880)
    "kontext-auto-resize": GuardCase("kontext-vae16", dict(
        image=_REFERENCE, prompt=GUARD_PROMPT, guidance_scale=3.5, max_sequence_length=GUARD_TEXT,
        max_area=64 * 64), 1.0, size=dict(height=64, width=64)),
    "kontext-text-alone": GuardCase("kontext", dict(
        prompt=GUARD_PROMPT, max_sequence_length=GUARD_TEXT, max_area=_SIZE), 1.0),
}
