"""Tiny VAEs built from config with random weights, one per supported VAE class."""
from __future__ import annotations

import torch
from diffusers import AutoencoderKL, AutoencoderKLFlux2

# 3 up blocks: the decoder upsamples by 4 (two nearest-2x upsamplers), mid-block attention on.
CONFIGS = {
    # FLUX.1 / SD3.5 / PixArt use AutoencoderKL (16 or 4 latent channels, shift/scale in the pipeline).
    # FLUX.1 and SD3.5 have no post_quant_conv; PixArt (SD's VAE) has one: the Flux2 config covers it.
    "AutoencoderKL": dict(
        in_channels=3, out_channels=3, latent_channels=4, layers_per_block=1, norm_num_groups=4,
        block_out_channels=(8, 16, 16),
        down_block_types=("DownEncoderBlock2D",) * 3, up_block_types=("UpDecoderBlock2D",) * 3,
        use_quant_conv=False, use_post_quant_conv=False,
    ),
    # FLUX.2: the same Decoder class, with its own decoder widths (decoder_block_out_channels) and
    # a 1x1 post_quant_conv; the pipeline undoes the latent batch-norm and 2x2 patchify before
    # vae.decode, so decode() sees plain [B, 32, H/8, W/8] latents.
    "AutoencoderKLFlux2": dict(
        in_channels=3, out_channels=3, latent_channels=8, layers_per_block=1, norm_num_groups=4,
        block_out_channels=(8, 16, 16), decoder_block_out_channels=(8, 12, 16),
        down_block_types=("DownEncoderBlock2D",) * 3, up_block_types=("UpDecoderBlock2D",) * 3,
    ),
}
CLASSES = {"AutoencoderKL": AutoencoderKL, "AutoencoderKLFlux2": AutoencoderKLFlux2}


def build_vae(kind: str, seed: int = 0, **overrides) -> torch.nn.Module:
    torch.manual_seed(seed)
    vae = CLASSES[kind](**{**CONFIGS[kind], **overrides}).eval()
    # Random init leaves GroupNorm at weight 1 / bias 0: perturb them so they are really tested.
    with torch.no_grad():
        for m in vae.modules():
            if isinstance(m, torch.nn.GroupNorm) and m.affine:
                m.weight.add_(0.3 * torch.randn_like(m.weight))
                m.bias.add_(0.3 * torch.randn_like(m.bias))
    return vae


def latents_for(kind: str, b: int, h: int, w: int, seed: int = 1) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(b, CONFIGS[kind]["latent_channels"], h, w, generator=g)


_GROUPS: dict = {}


def subgroup(ranks: list[int]):
    """A process group of these global ranks, made once per pool process.

    NOTE: every rank of the pool must call this (torch.distributed.new_group is collective)
    with the same ranks, in the same order of calls.
    """
    import torch.distributed as dist

    key = tuple(sorted(ranks))
    if key not in _GROUPS:
        _GROUPS[key] = dist.group.WORLD if len(key) == dist.get_world_size() else dist.new_group(list(key))
    return _GROUPS[key]
