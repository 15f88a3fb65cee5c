"""FLUX.1's tiny pipelines."""
from __future__ import annotations

import torch

from . import GUARD_PROMPT, GUARD_TEXT, GuardCase, TinyTests
from .parts import clip_text_model, clip_tokenizer, t5_text_model, t5_tokenizer, tiny_vae


def tiny_flux_pipeline(seed: int = 0, heads: int = 4, guidance_embeds: bool = False, double: int = 1,
                       single: int = 1, head_dim: int = 16):
    from diffusers import FlowMatchEulerDiscreteScheduler, FluxPipeline, FluxTransformer2DModel

    torch.manual_seed(seed)
    transformer = FluxTransformer2DModel(
        in_channels=16, num_layers=double, num_single_layers=single, attention_head_dim=head_dim,
        num_attention_heads=heads, joint_attention_dim=32, pooled_projection_dim=16, guidance_embeds=guidance_embeds,
        axes_dims_rope=(head_dim // 4, 3 * head_dim // 8, 3 * head_dim // 8),
    ).eval()
    return FluxPipeline(
        scheduler=FlowMatchEulerDiscreteScheduler(use_dynamic_shifting=True), vae=tiny_vae(),
        text_encoder=clip_text_model(), tokenizer=clip_tokenizer(), text_encoder_2=t5_text_model(32),
        tokenizer_2=t5_tokenizer(), transformer=transformer,
    )


# meshdit's splits a _cp_plan lacks (tests/models/test_diffusers_guard.py): a ControlNet's residuals, split with the image
PLAN_NOT_IN_CP_PLAN = {("", "controlnet_block_samples"): "a ControlNet's per-block residuals, split with the image",
                       ("", "controlnet_single_block_samples"): "a ControlNet's single-block residuals, likewise"}

BUILDERS = {
    "flux": tiny_flux_pipeline,
    "flux-4blocks": lambda seed=0: tiny_flux_pipeline(seed, double=2, single=2),
    "flux-6heads": lambda seed=0: tiny_flux_pipeline(seed, heads=6),
    "flux-distilled": lambda seed=0: tiny_flux_pipeline(seed, guidance_embeds=True),
    # hidden 256 (4 heads x 64): Linear layers wide enough that FP8 scales and biases are a small overhead
    "flux-wide": lambda seed=0: tiny_flux_pipeline(seed, head_dim=64),
}
TESTS = TinyTests(main="flux", four_blocks="flux-4blocks", guidance=3.0)  # true CFG
GUARD_CASES = {
    "flux": GuardCase("flux", dict(prompt=GUARD_PROMPT, max_sequence_length=GUARD_TEXT), 1.0),
    "flux-true-cfg": GuardCase("flux", dict(prompt=GUARD_PROMPT, negative_prompt="", true_cfg_scale=3.0,
                                            max_sequence_length=GUARD_TEXT), 3.0),
    "flux-guidance-distilled": GuardCase("flux-distilled", dict(prompt=GUARD_PROMPT, guidance_scale=3.5,
                                                                max_sequence_length=GUARD_TEXT), 3.5),
}


def diffusers_test_inputs(config, d) -> dict:
    """diffusers' test_models_transformer_flux.py: 4 x 4 image tokens, 48 text tokens, 3-axis ids."""
    b = d.batch
    return dict(hidden_states=d.randn(b, 16, config.in_channels),
                encoder_hidden_states=d.randn(b, 48, config.joint_attention_dim),
                pooled_projections=d.randn(b, config.pooled_projection_dim), img_ids=d.randn(16, 3),
                txt_ids=d.randn(48, 3), timestep=d.ones())
