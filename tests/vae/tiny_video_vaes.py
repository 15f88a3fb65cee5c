"""Tiny causal 3-D video VAEs with random weights, one per supported class (diffusers 0.42.1 configs, tiny widths).

Each decoder upsamples space by 4 (or 8: Wan 2.2's patchified VAE) and time too, with a mid
block attention where the class has one, so every kind of module the band split handles runs.
"""
from __future__ import annotations

import torch
from diffusers import (AutoencoderKLCogVideoX, AutoencoderKLHunyuanVideo, AutoencoderKLHunyuanVideo15, AutoencoderKLLTXVideo,
                       AutoencoderKLWan)

_WAN = dict(base_dim=8, z_dim=4, dim_mult=[1, 2, 2], num_res_blocks=1, temperal_downsample=[False, True],
            scale_factor_spatial=4, scale_factor_temporal=2, latents_mean=[0.0] * 4, latents_std=[1.0] * 4)
CONFIGS = {
    # Wan 2.1: frame-by-frame decode with feature caches, per-frame mid attention, 2-D and 3-D upsamplers.
    "Wan": (AutoencoderKLWan, _WAN),
    # Wan 2.2: residual up blocks (DupUp3D shortcuts), patch size 2 (unpatchify after the decoder).
    "Wan2.2": (AutoencoderKLWan, {**_WAN, "is_residual": True, "patch_size": 2, "in_channels": 12,
                                  "out_channels": 12, "decoder_base_dim": 8, "scale_factor_spatial": 8}),
    # CogVideoX: frame batches with conv caches, spatial norms conditioned on the latent.
    "CogVideoX": (AutoencoderKLCogVideoX, dict(
        block_out_channels=(8, 16, 16), latent_channels=4, layers_per_block=1, norm_num_groups=4,
        temporal_compression_ratio=2, down_block_types=("CogVideoXDownBlock3D",) * 3,
        up_block_types=("CogVideoXUpBlock3D",) * 3)),
    # HunyuanVideo: replicate-padded causal convs, causal attention over the whole latent video.
    "HunyuanVideo": (AutoencoderKLHunyuanVideo, dict(
        block_out_channels=(8, 16, 16), latent_channels=4, layers_per_block=1, norm_num_groups=4,
        temporal_compression_ratio=4, spatial_compression_ratio=4,
        down_block_types=("HunyuanVideoDownBlock3D",) * 3, up_block_types=("HunyuanVideoUpBlock3D",) * 3)),
    # HunyuanVideo 1.5: RMS norms, depth-to-space upsamplers with shortcuts, causal attention block.
    "HunyuanVideo15": (AutoencoderKLHunyuanVideo15, dict(
        latent_channels=4, block_out_channels=(16, 16, 8), layers_per_block=1, spatial_compression_ratio=4,
        temporal_compression_ratio=2)),
    # LTX: timestep-conditioned decoder, depth-to-space upsampler, patch size 2.
    "LTX": (AutoencoderKLLTXVideo, dict(
        latent_channels=4, block_out_channels=(8, 8, 8, 8), decoder_block_out_channels=(8, 8, 8, 8),
        layers_per_block=(1, 1, 1, 1, 1), decoder_layers_per_block=(1, 1, 1, 1, 1),
        spatio_temporal_scaling=(True, False, False, False), decoder_spatio_temporal_scaling=(True, False, False, False),
        timestep_conditioning=True, patch_size=2, patch_size_t=1)),
}
KINDS = list(CONFIGS)
SCALE = {"Wan2.2": 8}   # output pixels per latent pixel; 4 for the others


def build_video_vae(kind: str, seed: int = 0) -> torch.nn.Module:
    cls, config = CONFIGS[kind]
    torch.manual_seed(seed)
    vae = cls(**config).eval()
    with torch.no_grad():   # random init leaves norms at weight 1 / bias 0: perturb them so they are really tested
        for m in vae.modules():
            if isinstance(m, torch.nn.GroupNorm) and m.affine:
                m.weight.add_(0.3 * torch.randn_like(m.weight))
                m.bias.add_(0.3 * torch.randn_like(m.bias))
            if type(m).__name__ in ("WanRMS_norm", "HunyuanVideo15RMS_norm"):
                m.gamma.add_(0.3 * torch.randn_like(m.gamma))
    return vae


def video_latents(kind: str, b: int, f: int, h: int, w: int, seed: int = 1) -> torch.Tensor:
    config = CONFIGS[kind][1]
    g = torch.Generator().manual_seed(seed)
    return torch.randn(b, config.get("latent_channels", config.get("z_dim")), f, h, w, generator=g)


def decode_kwargs(kind: str, b: int) -> dict:
    """LTX's decoder is conditioned on the denoising timestep: vae.decode(z, temb=...)."""
    return {"temb": torch.full((b,), 0.05)} if kind == "LTX" else {}
