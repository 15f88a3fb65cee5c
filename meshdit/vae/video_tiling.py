"""Tiled decode of the video VAEs: meshdit's tile flags mapped onto each VAE's own tiling. Approximate.

The causal 3-D VAEs carry their own tiled decode (vae.enable_tiling(...)): spatial tiles
decoded with every frame and their frame caches, blended linearly over the overlap; and for
HunyuanVideo and LTX, temporal tiles (framewise decoding). meshdit sets the same attributes
enable_tiling sets, from its settings, for one decode, and puts the VAE's own back after:

- tile_sample_min_height/width  = --vae-tile-height/--vae-tile-width (px; unset: the whole image)
- tile_sample_stride_height/width = tile - --vae-tile-overlap   (CogVideoX: its overlap factor
  tile_overlap_factor_* = overlap / tile, and tile_latent_min_* = tile / scale, as its enable_tiling;
  HunyuanVideo 1.5: one tile_overlap_factor, so square tiles only)
- tile_sample_min_num_frames = --vae-tile-frames, stride = tile frames - the temporal compression
  ratio (one latent frame shared, as diffusers' 16 / 12 default), use_framewise_decoding on.

So the result is diffusers' own tiled decode with those sizes (tested equal).
"""
from __future__ import annotations

import contextlib

from ..errors import ConfigError
from ..flag_spec import flag_text
from .settings import VaeDecodeSettings

# Which VAE classes can tile in time (framewise decoding with tile_sample_min_num_frames).
TEMPORAL_TILING = ("AutoencoderKLHunyuanVideo", "AutoencoderKLLTXVideo")
_SAVED = ("use_tiling", "use_framewise_decoding", "tile_sample_min_height", "tile_sample_min_width",
          "tile_sample_stride_height", "tile_sample_stride_width", "tile_sample_min_num_frames",
          "tile_sample_stride_num_frames", "tile_latent_min_height", "tile_latent_min_width",
          "tile_overlap_factor_height", "tile_overlap_factor_width", "tile_overlap_factor")


def tiling_attributes(vae, settings: VaeDecodeSettings, height: int, width: int, scale: int) -> dict:
    """The attributes vae.enable_tiling would set for these settings; height, width: the image's, in px."""
    name = type(vae).__name__
    tile_h, tile_w = settings.tile_height or height, settings.tile_width or width
    attrs = dict(use_tiling=True, tile_sample_min_height=tile_h, tile_sample_min_width=tile_w)
    overlap = settings.tile_overlap
    if name == "AutoencoderKLHunyuanVideo15":   # square tiles, one overlap factor (decoding.py checks square)
        attrs.update(tile_latent_min_height=tile_h // scale, tile_latent_min_width=tile_w // scale,
                     tile_overlap_factor=overlap / tile_h)
    elif name == "AutoencoderKLCogVideoX":   # overlap as a fraction of the tile; tiles in latent rows too
        attrs.update(tile_latent_min_height=tile_h // scale, tile_latent_min_width=tile_w // scale,
                     tile_overlap_factor_height=overlap / tile_h if settings.tile_height else 0.0,
                     tile_overlap_factor_width=overlap / tile_w if settings.tile_width else 0.0)
    else:   # an axis left whole gets one tile: stride = the whole axis
        attrs.update(tile_sample_stride_height=tile_h - overlap if settings.tile_height else tile_h,
                     tile_sample_stride_width=tile_w - overlap if settings.tile_width else tile_w)
    if settings.tile_frames is not None:
        frames_flag = flag_text(VaeDecodeSettings, "tile_frames")
        if name not in TEMPORAL_TILING:
            raise ConfigError(f"{frames_flag}: {name} has no temporal tiling (only {', '.join(TEMPORAL_TILING)}); "
                              f"drop {frames_flag}.")
        ratio = vae.temporal_compression_ratio
        if settings.tile_frames % ratio or settings.tile_frames <= ratio:
            raise ConfigError(f"{frames_flag} ({settings.tile_frames}) must be a multiple of the VAE's temporal "
                              f"compression ratio {ratio} above it (tiles share one latent frame); e.g. "
                              f"{frames_flag} {4 * ratio}.")
        attrs.update(use_framewise_decoding=True, tile_sample_min_num_frames=settings.tile_frames,
                     tile_sample_stride_num_frames=settings.tile_frames - ratio)
    return attrs


@contextlib.contextmanager
def builtin_tiling(vae, attrs: dict):
    """The VAE's own tiling with `attrs` for the block; its own attributes put back after."""
    saved = {k: getattr(vae, k) for k in _SAVED if hasattr(vae, k)}
    try:
        for key, value in attrs.items():
            setattr(vae, key, value)
        yield vae
    finally:
        for key in attrs:
            if key not in saved:
                delattr(vae, key)
        for key, value in saved.items():
            setattr(vae, key, value)
