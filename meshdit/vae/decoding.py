"""meshdit.vae.decode(): one entry point for local, patch-parallel, tiled and parallel+tiled decodes."""
from __future__ import annotations

import contextlib

import torch

from ..distributed.comm import all_gather, broadcast_from, group_rank, group_size
from ..errors import ConfigError
from .memory import track_peak_memory
from .patch_parallel import decode_bands, plan_bands
from .settings import VIDEO_VAE_CLASSES, VaeDecodeSettings, video_spatial_scale
from .tiled import tiled_decode
from .video_tiling import builtin_tiling, tiling_attributes


def is_video_vae(vae) -> bool:
    """One of the causal 3-D video VAEs (latents [B, C, F, h, w])."""
    return type(vae).__name__ in VIDEO_VAE_CLASSES


def upsampling_factor(vae) -> int:
    """Output pixels per latent pixel along each axis (8 for the FLUX, SD3, PixArt VAEs and most video VAEs)."""
    if is_video_vae(vae):
        return video_spatial_scale({"_class_name": type(vae).__name__, **vae.config})
    ups = sum(1 for block in vae.decoder.up_blocks if getattr(block, "upsamplers", None))
    return 2**ups


@contextlib.contextmanager
def _no_builtin_tiling(vae):
    """diffusers' own enable_tiling() would re-split our bands and tiles: off while we decode."""
    saved = getattr(vae, "use_tiling", None)
    if saved is not None:
        vae.use_tiling = False
    try:
        yield
    finally:
        if saved is not None:
            vae.use_tiling = saved


def _check_same_call(latents: torch.Tensor, settings: VaeDecodeSettings, group) -> None:
    """Fails on every rank, naming the odd ones, if ranks disagree on the latents or settings.

    Compares shapes, settings and two checksums of the latent values (a plain and a
    position-weighted sum), so ranks that hold different latents (e.g. a group that
    crosses data-parallel replicas) are caught instead of decoding a patchwork image.
    NOTE: every rank of the group joins this all_gather (before any other collective),
    so a mismatch is an error on all ranks rather than a hang in a later collective.
    """
    flat = latents.detach().reshape(-1).to(torch.float64)
    position = torch.arange(1, flat.numel() + 1, dtype=torch.float64, device=flat.device) / flat.numel()
    mine = torch.tensor([*latents.shape, int(settings.parallel), settings.tile_height or 0,
                         settings.tile_width or 0, settings.tile_overlap, settings.tile_frames or 0, 0.0, 0.0],
                        dtype=torch.float64, device=flat.device)   # on the latents' device: NCCL needs it there
    mine[-2:] = torch.stack([flat.sum(), (flat * position).sum()])
    scale = float(flat.abs().sum()) + 1.0
    everyone = all_gather(mine, group, "vae_check_all_gather")
    odd = [r for r, t in enumerate(everyone)
           if not torch.equal(t[:-2], everyone[0][:-2]) or (t[-2:] - everyone[0][-2:]).abs().max() > 1e-9 * scale]
    if odd:
        what = [[round(v, 4) for v in everyone[r].tolist()] for r in [0, *odd]]
        raise ConfigError(
            f"VAE decode: group ranks {odd} called decode with latents (shape or values) or settings different "
            f"from group rank 0 ([B, C, (F,) h, w, parallel, tile h, tile w, overlap, tile frames, checksums]: "
            f"{what}); every rank "
            "of the group must decode the same latents with the same settings."
        )


def decodes_here(settings: VaeDecodeSettings, group) -> bool:
    """Whether this rank runs the VAE: every rank of `group` when the decode is parallel, else its rank 0 alone.

    The other ranks of the group get the images from its rank 0 (share_images) and need
    no VAE weights (meshdit's memory-efficient load leaves them on the meta device).
    """
    return _every_rank_decodes(settings, group) or group_rank(group) == 0


def _every_rank_decodes(settings: VaeDecodeSettings, group) -> bool:
    return settings.parallel or group_size(group) == 1


def share_images(image: torch.Tensor | None, settings: VaeDecodeSettings, group, device) -> torch.Tensor:
    """The decoded images [B, 3, H, W] on every rank of `group`: sent from its rank 0 when only that rank decoded.

    image: what this rank decoded (None where decodes_here() is False); received on `device`.
    NOTE: every rank of the group joins this call.
    """
    if _every_rank_decodes(settings, group):
        return image
    return broadcast_from(image, 0, group, "vae_images_broadcast", device)


def decode(vae, latents: torch.Tensor, settings: VaeDecodeSettings | None = None,
           group=None, **vae_kwargs) -> torch.Tensor:
    """Same result as vae.decode(latents, return_dict=False, **vae_kwargs)[0] (exact for parallel-only; approximate when tiled).

    latents: [B, C, h, w] already scaled/shifted as the pipeline would pass to vae.decode
    (for FLUX.2: after the pipeline's batch-norm inverse and unpatchify); for the video VAEs
    (AutoencoderKLWan, -CogVideoX, -HunyuanVideo, -HunyuanVideo15, -LTXVideo) [B, C, F, h, w], split along h too.
    vae_kwargs: passed on to vae.decode (LTX's timestep conditioning `temb`).
    group: ranks that share the work (None or size 1: local). With settings.parallel the
    latent is split into row bands over the group (or, when tiled, the tiles are shared
    out); without it every rank decodes the whole image by itself.
    NOTE: with settings.parallel and a group of >1 ranks, every rank of the group must call
    this with the same latents and settings; every rank gets the full image.
    diffusers' own vae.enable_tiling() is ignored here: `settings` own tiling (a video VAE's
    tiles are its own tiled decode with meshdit's sizes: video_tiling.py).
    """
    settings = settings or VaeDecodeSettings()
    if type(vae).__name__ == "AutoencoderKLHunyuanVideo15" and latents.dim() == 5 and latents.shape[0] > 1:
        # its mid attention's causal mask [B, S, S] meets attention scores [B, 1, S, S] and fails for B > 1 (diffusers
        # 0.42): video by video, which is what it computes for each video (nothing else crosses the batch)
        return torch.cat([decode(vae, latents[i:i + 1], settings, group, **vae_kwargs)
                          for i in range(latents.shape[0])])
    video = is_video_vae(vae)
    if latents.dim() != (5 if video else 4):
        shape = "[B, C, F, h, w] for the video VAE " + type(vae).__name__ if video else "[B, C, h, w]"
        raise ConfigError(f"latents must be {shape}; got shape {tuple(latents.shape)}.")
    scale = upsampling_factor(vae)
    settings.validate(scale)
    if video and settings.parallel and settings.tiled:
        raise ConfigError(f"{type(vae).__name__}: a video VAE decodes either in bands over the ranks "
                          "(--use-parallel-vae) or in its own tiles (--vae-tile-*), not both; drop one of them.")
    if type(vae).__name__ == "AutoencoderKLHunyuanVideo15" and settings.tiled and (
            settings.tile_height != settings.tile_width):
        raise ConfigError("AutoencoderKLHunyuanVideo15 tiles with square tiles (one overlap factor): set "
                          "--vae-tile-height and --vae-tile-width to the same size.")
    if not video and settings.tile_frames is not None:
        raise ConfigError("--vae-tile-frames is for video VAEs (HunyuanVideo, LTX); drop it for an image VAE.")
    world = group_size(group)
    shared = settings.parallel and world > 1
    rank = group_rank(group) if shared else 0
    if shared:
        _check_same_call(latents, settings, group)
    h, w = latents.shape[-2:]
    with torch.no_grad(), _no_builtin_tiling(vae), track_peak_memory(
        latents.device, ranks=world if shared else 1, rank=rank, latent_shape=tuple(latents.shape)
    ) as report:
        report["mode"] = ("parallel+tiled" if shared else "tiled") if settings.tiled else (
            "parallel" if shared else "local")
        if settings.tiled and video:   # the VAE's own tiled decode, with meshdit's tile sizes
            with builtin_tiling(vae, tiling_attributes(vae, settings, h * scale, w * scale, scale)):
                image = vae.decode(latents, return_dict=False, **vae_kwargs)[0]
        elif settings.tiled:
            image = tiled_decode(
                lambda z: vae.decode(z, return_dict=False)[0], latents, scale, vae.config.out_channels,
                settings.tile_height // scale if settings.tile_height else None,
                settings.tile_width // scale if settings.tile_width else None,
                settings.tile_overlap // scale, group if shared else None,
            )
        elif shared and (plan := plan_bands(h, group)) is not None:
            image = decode_bands(vae, latents, plan, **vae_kwargs)
        else:  # local, or fewer latent rows than ranks: every rank decodes the whole latent
            if shared:
                report["mode"] = "local (fewer latent rows than ranks)"
            image = vae.decode(latents, return_dict=False, **vae_kwargs)[0]
        report["image_shape"] = tuple(image.shape)
    return image
