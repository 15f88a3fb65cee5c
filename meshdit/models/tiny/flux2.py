"""FLUX.2's tiny pipelines (no text encoder: they generate from prompt embeddings)."""
from __future__ import annotations

import torch

from . import GuardCase, TinyTests


def tiny_flux2_pipeline(seed: int = 0, double: int = 1, single: int = 1):
    """Flux2Pipeline without its Mistral text encoder: generate with prompt_embeds."""
    from diffusers import AutoencoderKLFlux2, FlowMatchEulerDiscreteScheduler, Flux2Pipeline, Flux2Transformer2DModel

    torch.manual_seed(seed)
    transformer = Flux2Transformer2DModel(
        in_channels=16, num_layers=double, num_single_layers=single, attention_head_dim=16, num_attention_heads=4,
        joint_attention_dim=32, timestep_guidance_channels=32, mlp_ratio=2.0, axes_dims_rope=(4, 4, 4, 4),
    ).eval()
    vae = AutoencoderKLFlux2(
        block_out_channels=(8, 16), layers_per_block=1, latent_channels=4, norm_num_groups=8,
        down_block_types=("DownEncoderBlock2D",) * 2, up_block_types=("UpDecoderBlock2D",) * 2, sample_size=32,
    ).eval()
    return Flux2Pipeline(scheduler=FlowMatchEulerDiscreteScheduler(use_dynamic_shifting=True), vae=vae,
                         text_encoder=None, tokenizer=None, transformer=transformer)


# meshdit's splits a _cp_plan lacks (tests/models/test_diffusers_guard.py): a ControlNet's residuals, split with the image
PLAN_NOT_IN_CP_PLAN = {("", "controlnet_block_samples"): "a ControlNet's per-block residuals, split with the image",
                       ("", "controlnet_single_block_samples"): "a ControlNet's single-block residuals, likewise"}

BUILDERS = {
    "flux2": tiny_flux2_pipeline,
    "flux2-4blocks": lambda seed=0: tiny_flux2_pipeline(seed, double=2, single=2),
}
# guidance-distilled: no CFG branch to split; data parallelism on three prompts; no text encoder: embeddings
TESTS = TinyTests(main="flux2", four_blocks="flux2-4blocks", layouts=("dp2-3prompts",), prompt_embeds=(5, 32))
FLUX2_EMBEDS = torch.randn(1, 5, 32, generator=torch.Generator().manual_seed(7))
GUARD_CASES = {
    "flux2": GuardCase("flux2", dict(prompt_embeds=FLUX2_EMBEDS, guidance_scale=4.0), 4.0,
                       {"prompt_embeds": FLUX2_EMBEDS}),
}


def diffusers_test_inputs(config, d) -> dict:
    """diffusers' test_models_transformer_flux2.py: 4 x 4 image tokens, 48 text tokens, 4-axis ids (t, h, w, l)."""
    b = d.batch
    image_ids = torch.cartesian_prod(torch.arange(1), torch.arange(4), torch.arange(4), torch.arange(1))  # [16, 4]
    text_ids = torch.cartesian_prod(torch.arange(1), torch.arange(1), torch.arange(1), torch.arange(48))  # [48, 4]
    return dict(hidden_states=d.randn(b, 16, config.in_channels),
                encoder_hidden_states=d.randn(b, 48, config.joint_attention_dim),
                img_ids=image_ids.expand(b, -1, -1), txt_ids=text_ids.expand(b, -1, -1), timestep=d.ones(),
                guidance=d.ones())
