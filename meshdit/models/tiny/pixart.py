"""PixArt-Sigma and -Alpha's tiny pipelines."""
from __future__ import annotations

import torch

from . import GUARD_PROMPT, GUARD_TEXT, GuardCase, TinyTests
from .parts import t5_text_model, t5_tokenizer, tiny_vae


def tiny_pixart_pipeline(seed: int = 0, variant: str = "sigma", layers: int = 2):
    from diffusers import (DPMSolverMultistepScheduler, PixArtAlphaPipeline, PixArtSigmaPipeline,
                           PixArtTransformer2DModel)

    torch.manual_seed(seed)
    transformer = PixArtTransformer2DModel(
        sample_size=16, num_layers=layers, patch_size=2, attention_head_dim=8, num_attention_heads=4,
        caption_channels=32, in_channels=4, cross_attention_dim=32, out_channels=8, attention_bias=True,
        activation_fn="gelu-approximate", num_embeds_ada_norm=1000, norm_type="ada_norm_single",
        norm_elementwise_affine=False, norm_eps=1e-6,
    ).eval()
    cls = PixArtSigmaPipeline if variant == "sigma" else PixArtAlphaPipeline
    return cls(tokenizer=t5_tokenizer(), text_encoder=t5_text_model(32), vae=tiny_vae(shift_factor=None),
               transformer=transformer, scheduler=DPMSolverMultistepScheduler())


BUILDERS = {
    "pixart-sigma": tiny_pixart_pipeline,
    "pixart-alpha": lambda seed=0: tiny_pixart_pipeline(seed, "alpha"),
    "pixart-sigma-4blocks": lambda seed=0: tiny_pixart_pipeline(seed, layers=4),
}
TESTS = TinyTests(main="pixart-sigma", four_blocks="pixart-sigma-4blocks", variants=("pixart-alpha",))
GUARD_CASES = {
    name: GuardCase(name, dict(prompt=GUARD_PROMPT, guidance_scale=4.5, max_sequence_length=GUARD_TEXT,
                               use_resolution_binning=False), 4.5)
    for name in ("pixart-sigma", "pixart-alpha")
}


def diffusers_test_inputs(config, d) -> dict:
    """diffusers' test_models_pixart_transformer2d.py: an 8 x 8 latent, 8 text tokens."""
    b = d.batch
    return dict(hidden_states=d.randn(b, config.in_channels, 8, 8), timestep=d.steps(),
                encoder_hidden_states=d.randn(b, 8, config.caption_channels),
                added_cond_kwargs={"aspect_ratio": None, "resolution": None})
