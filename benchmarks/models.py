"""The benchmark model: a Flux-shaped transformer (~7 M parameters) in a FluxPipeline, built in code.

Random weights, no downloads. Every builder seeds torch, so every rank (and the
serial baseline) holds the same weights.
"""
from __future__ import annotations

import copy
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class ModelSize:
    """Transformer shape. `full` is the ~7 M-parameter model of the issue; `quick` is for tests."""

    name: str
    heads: int
    head_dim: int
    double_blocks: int
    single_blocks: int
    rope_axes: tuple[int, int, int]  # sums to head_dim

    @property
    def hidden(self) -> int:
        return self.heads * self.head_dim


FULL = ModelSize("flux-7m", heads=4, head_dim=64, double_blocks=2, single_blocks=2, rope_axes=(16, 24, 24))
QUICK = ModelSize("flux-tiny", heads=2, head_dim=16, double_blocks=1, single_blocks=1, rope_axes=(4, 6, 6))

LATENT_CHANNELS = 4  # tiny VAE: 4 latent channels, scale factor 2; Flux packs 2x2 -> transformer in_channels 16
TEXT_DIM = 32  # tiny T5 d_model = the transformer's joint_attention_dim


def flux_transformer(size: ModelSize, seed: int = 0):
    from diffusers import FluxTransformer2DModel

    torch.manual_seed(seed)
    return FluxTransformer2DModel(
        patch_size=1, in_channels=4 * LATENT_CHANNELS, num_layers=size.double_blocks,
        num_single_layers=size.single_blocks, attention_head_dim=size.head_dim, num_attention_heads=size.heads,
        joint_attention_dim=TEXT_DIM, pooled_projection_dim=16, guidance_embeds=False, axes_dims_rope=size.rope_axes,
    ).eval()


def flux_pipeline(size: ModelSize, seed: int = 0):
    """FluxPipeline with the benchmark transformer and meshdit's tiny text encoders and VAE."""
    from diffusers import FlowMatchEulerDiscreteScheduler, FluxPipeline

    from meshdit.testing.tiny_models import clip_text_model, clip_tokenizer, t5_text_model, t5_tokenizer, tiny_vae

    transformer = flux_transformer(size, seed)
    torch.manual_seed(seed + 1)
    pipe = FluxPipeline(
        scheduler=FlowMatchEulerDiscreteScheduler(use_dynamic_shifting=True), vae=tiny_vae(LATENT_CHANNELS),
        text_encoder=clip_text_model(), tokenizer=clip_tokenizer(), text_encoder_2=t5_text_model(TEXT_DIM),
        tokenizer_2=t5_tokenizer(), transformer=transformer,
    )
    pipe.set_progress_bar_config(disable=True)
    return pipe


def with_transformer_copy(pipe):
    """A pipeline sharing every component with `pipe` except a deep copy of the transformer
    (hooks of one parallel method must not reach another method's model)."""
    from diffusers import FluxPipeline

    other = FluxPipeline(**{**pipe.components, "transformer": copy.deepcopy(pipe.transformer),
                            "scheduler": copy.deepcopy(pipe.scheduler)})
    other.set_progress_bar_config(disable=True)
    return other


def pixels_for_tokens(image_tokens: int) -> int:
    """Square image side (pixels) giving `image_tokens` packed Flux tokens: VAE /2, then 2x2 packing."""
    side = int(round(image_tokens ** 0.5))
    assert side * side == image_tokens, "image token counts must be squares"
    return side * 4


def param_bytes(module: torch.nn.Module) -> int:
    return sum(p.numel() * p.element_size() for p in module.parameters())
