"""What the band split knows about the causal 3-D video VAEs' own modules (diffusers 0.42.1).

The video decoders (AutoencoderKLWan, -CogVideoX, -HunyuanVideo, -HunyuanVideo15, -LTXVideo, and Qwen-Image's
AutoencoderKLQwenImage, Wan's VAE under its own class names, for one frame) are built from the
same few kinds of parts as the image decoder, wrapped in their own classes:

- causal 3-D convs: pad time on the past side only (zeros, replicated first frame, or frames
  cached from the previous chunk: Wan's feat_cache, CogVideoX's conv_cache) and pad H and W
  themselves (zeros, replicate) before an unpadded Conv3d, or let the inner Conv3d pad them.
  Time is never split, so only their H padding matters: a halo of k_h // 2 rows. A cached
  chunk's rows sit at the same heights as the input's, so the cache gets the same halo.
- per-pixel channel norms (Wan's and HunyuanVideo 1.5's RMS norms, LTX's RMSNorm / LayerNorm over
  channels): row-local.
- nearest / duplicating upsamplers (Wan's nearest-exact 2x, DupUp3D, LTX's and HunyuanVideo 1.5's depth-to-space,
  CogVideoX's and HunyuanVideo's F.interpolate calls inside their own forwards): each output
  row comes from one input row of the same band.
- attention over whole frames (Wan's mid block: per frame) or the whole latent video
  (HunyuanVideo's mid block: causal over frames, its mask built from the latent's height, so
  the whole mid block runs gathered; HunyuanVideo 1.5's attention block, which builds its own mask).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch.nn as nn
from diffusers.models.autoencoders.autoencoder_kl_cogvideox import CogVideoXCausalConv3d
from diffusers.models.autoencoders.autoencoder_kl_hunyuan_video import HunyuanVideoCausalConv3d, HunyuanVideoMidBlock3D
from diffusers.models.autoencoders.autoencoder_kl_hunyuanvideo15 import (HunyuanVideo15AttnBlock,
                                                                         HunyuanVideo15CausalConv3d,
                                                                         HunyuanVideo15RMS_norm)
from diffusers.models.autoencoders.autoencoder_kl_ltx import LTXVideoCausalConv3d, LTXVideoResnetBlock3d
from diffusers.models.autoencoders.autoencoder_kl_qwenimage import (QwenImageAttentionBlock, QwenImageCausalConv3d,
                                                                    QwenImageRMS_norm, QwenImageUpsample)
from diffusers.models.autoencoders.autoencoder_kl_wan import (DupUp3D, WanAttentionBlock, WanCausalConv3d,
                                                              WanRMS_norm, WanUpsample)
from diffusers.models.embeddings import PixArtAlphaCombinedTimestepSizeEmbeddings
from diffusers.models.normalization import RMSNorm

from ..errors import ConfigError

_REFUSE_HINT = "run without --use-parallel-vae (the --vae-tile-* flags bound memory too)"


@dataclass(frozen=True)
class CausalConv:
    """How to recompute a causal conv's border rows: its halo, and its frame-cache argument."""

    halo: int                  # rows needed from each neighbour (k_h // 2)
    cache_arg: str | None      # the forward's cached-frames argument (a tensor or None), if any
    returns_cache: bool        # forward returns (output, new cache) rather than the output


def _check(module: nn.Module, conv: nn.Conv3d, h_pad: int) -> int:
    """h_pad: the H padding the module applies (itself or through conv); refuses what bands cannot reproduce."""
    kh = conv.kernel_size[1]
    if conv.stride[1:] != (1, 1) or conv.dilation[1:] != (1, 1) or kh % 2 == 0 or h_pad != kh // 2:
        raise ConfigError(f"parallel VAE decode supports stride-1 'same'-padded convs in H and W only; found "
                          f"{type(module).__name__} {conv}; {_REFUSE_HINT}.")
    return h_pad


def causal_conv(module: nn.Module) -> CausalConv | None:
    """The CausalConv of a video VAE's causal conv wrapper; None for any other module."""
    if isinstance(module, (WanCausalConv3d, QwenImageCausalConv3d)):  # an nn.Conv3d that F.pads itself
        return CausalConv(_check(module, module, module._padding[2]), "cache_x", False)
    if isinstance(module, CogVideoXCausalConv3d):  # inner conv pads H (constant mode) or F.pad replicate does
        pad = module.time_causal_padding[2] if module.pad_mode == "replicate" else module.conv.padding[1]
        return CausalConv(_check(module, module.conv, pad), "conv_cache", True)
    if isinstance(module, (HunyuanVideoCausalConv3d, HunyuanVideo15CausalConv3d)):  # F.pad (replicate), unpadded conv
        if module.conv.padding != (0, 0, 0):
            raise ConfigError(f"parallel VAE decode: {module} pads twice; {_REFUSE_HINT}.")
        return CausalConv(_check(module, module.conv, module.time_causal_padding[2]), None, False)
    if isinstance(module, LTXVideoCausalConv3d):   # time padded by repeated frames, the conv pads H and W
        return CausalConv(_check(module, module.conv, module.conv.padding[1]), None, False)
    return None


def runs_gathered(module: nn.Module) -> bool:
    """Modules that need whole frames (attention): run on the gathered latent, each rank keeps its rows."""
    if isinstance(module, (WanAttentionBlock, QwenImageAttentionBlock, HunyuanVideo15AttnBlock)):
        return True
    # Its forward builds the causal attention mask from the height it sees: the whole block runs gathered.
    return isinstance(module, HunyuanVideoMidBlock3D) and any(a is not None for a in module.attentions)


def is_conditioning(module: nn.Module) -> bool:
    """Modules that see only the timestep (LTX's decoder conditioning), never image rows: left alone."""
    return isinstance(module, PixArtAlphaCombinedTimestepSizeEmbeddings)


def is_row_local(module: nn.Module) -> bool:
    """Video leaves whose every output row comes from input rows of the same band (known usage only)."""
    if isinstance(module, (WanRMS_norm, QwenImageRMS_norm, HunyuanVideo15RMS_norm)):
        return module.channel_first                   # F.normalize over channels, per pixel
    if isinstance(module, (WanUpsample, QwenImageUpsample)):
        factors = module.scale_factor if isinstance(module.scale_factor, tuple) else (module.scale_factor,) * 2
        return module.mode in ("nearest", "nearest-exact") and all(float(f).is_integer() for f in factors)
    # DupUp3D: channels to 2x2 pixel blocks; RMSNorm / LayerNorm: LTX applies them over channels (movedim(1, -1)).
    return isinstance(module, (DupUp3D, RMSNorm, nn.LayerNorm))


def check_refused(module: nn.Module) -> None:
    """Raises for video modules whose result no band split can reproduce."""
    if isinstance(module, LTXVideoResnetBlock3d) and module.per_channel_scale1 is not None:
        raise ConfigError("parallel VAE decode: this LTX decoder injects random spatial noise (decoder_inject_noise), "
                          f"which no split over ranks can draw as one process does; {_REFUSE_HINT}.")
