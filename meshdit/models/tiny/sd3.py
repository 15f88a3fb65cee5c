"""Stable Diffusion 3 and 3.5's tiny pipelines."""
from __future__ import annotations

import torch

from . import GUARD_PROMPT, GUARD_TEXT, GuardCase, TinyTests
from .parts import clip_text_model, clip_tokenizer, t5_text_model, t5_tokenizer, tiny_vae


def tiny_sd3_pipeline(seed: int = 0, sd35: bool = True, layers: int = 2):
    """SD3 (sd35=False) or SD3.5-shaped: dual attention layers and RMS qk-norm."""
    from diffusers import FlowMatchEulerDiscreteScheduler, SD3Transformer2DModel, StableDiffusion3Pipeline

    torch.manual_seed(seed)
    transformer = SD3Transformer2DModel(
        sample_size=16, patch_size=2, in_channels=4, num_layers=layers, attention_head_dim=8, num_attention_heads=4,
        joint_attention_dim=32, caption_projection_dim=32, pooled_projection_dim=32, out_channels=4,
        pos_embed_max_size=32, dual_attention_layers=(0,) if sd35 else (), qk_norm="rms_norm" if sd35 else None,
    ).eval()
    return StableDiffusion3Pipeline(
        scheduler=FlowMatchEulerDiscreteScheduler(shift=3.0), vae=tiny_vae(),
        text_encoder=clip_text_model(with_projection=True), tokenizer=clip_tokenizer(),
        text_encoder_2=clip_text_model(with_projection=True), tokenizer_2=clip_tokenizer(),
        text_encoder_3=t5_text_model(32), tokenizer_3=t5_tokenizer(), transformer=transformer,
    )


BUILDERS = {
    "sd3": lambda seed=0: tiny_sd3_pipeline(seed, sd35=False),
    "sd35": tiny_sd3_pipeline,
    "sd35-4blocks": lambda seed=0: tiny_sd3_pipeline(seed, layers=4),
    "sd3-4blocks": lambda seed=0: tiny_sd3_pipeline(seed, sd35=False, layers=4),
}
TESTS = TinyTests(main="sd35", four_blocks="sd35-4blocks", variants=("sd3",), tensor_parallel=("sd35", "sd3"))
GUARD_CASES = {
    name: GuardCase(name, dict(prompt=GUARD_PROMPT, guidance_scale=5.0, max_sequence_length=GUARD_TEXT), 5.0)
    for name in ("sd3", "sd35")
}
# skip-layer guidance: 3 steps, the pipeline's window start * 3 < i < stop * 3 holds steps 1 and 2 (step 0: CFG alone)
SKIP_LAYER_GUIDANCE = dict(skip_guidance_layers=[1], skip_layer_guidance_scale=2.5, skip_layer_guidance_start=0.2,
                           skip_layer_guidance_stop=0.7)
GUARD_CASES["sd35-skip-layer-guidance"] = GuardCase(
    "sd35", dict(prompt=GUARD_PROMPT, guidance_scale=5.0, max_sequence_length=GUARD_TEXT, **SKIP_LAYER_GUIDANCE), 5.0,
    extra=SKIP_LAYER_GUIDANCE, size=dict(num_inference_steps=3))


def diffusers_test_inputs(config, d) -> dict:
    """diffusers' test_models_transformer_sd3.py: a 32 x 32 latent, 154 text tokens."""
    b = d.batch
    return dict(hidden_states=d.randn(b, config.in_channels, 32, 32),
                encoder_hidden_states=d.randn(b, 154, config.joint_attention_dim),
                pooled_projections=d.randn(b, config.pooled_projection_dim), timestep=d.steps())
