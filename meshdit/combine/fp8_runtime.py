"""What an Fp8Config installs: the attention backend, the wire codecs, FP8 weights."""
from __future__ import annotations

import torch

from ..attention.fp8 import fp8_attention_with_lse, gpu_kernel
from ..attention.usp import EXACT, WireCodecs
from ..quant.codec import Fp8WireCodec
from ..quant.formats import check_fp8_gemm, fp8_dtype
from ..quant.settings import Fp8Config


class Fp8AttentionBackend:
    name = "fp8"

    @staticmethod
    def local(q, k, v, scale):
        return fp8_attention_with_lse(q, k, v, scale)[0]

    @staticmethod
    def with_lse(q, k, v, scale):
        return fp8_attention_with_lse(q, k, v, scale)


def attention_backend(fp8: Fp8Config | None, device: torch.device):
    """None means torch's SDPA, untouched. On a GPU, finds (and logs) the FP8 kernel now, at start."""
    if fp8 is None or fp8.attention != "fp8":
        return None
    gpu_kernel(device)
    return Fp8AttentionBackend()


def wire_codecs(fp8: Fp8Config | None, device: torch.device) -> WireCodecs:
    """Ulysses sends Q, V and the output in FP8 (K too with comm_k); ring sends its K/V blocks in FP8."""
    if fp8 is None or not fp8.comm:
        return EXACT
    fmt = fp8_dtype(device)
    heads = Fp8WireCodec(token_dim=2, format=fmt)  # [B, H, S, D]: a scale per token over its heads
    return WireCodecs(q=heads, k=heads if fp8.comm_k else None, v=heads, out=heads,
                      ring=Fp8WireCodec(token_dim=3, format=fmt))  # [2, B, H, S, D]: one scale for K and V


def pipe_codec_for(fp8: Fp8Config | None, device: torch.device):
    """PipeFusion's stage-to-stage activations [B, S, C] and latent patches ([B, S, C] or [B, C, h, W])."""
    if fp8 is None or not fp8.comm:
        return None
    fmt = fp8_dtype(device)
    # 64 values per scale at least: the latents have few channels per token (16 for FLUX.1's packed latents)
    by_dim = {3: Fp8WireCodec(token_dim=1, format=fmt, min_values_per_scale=64),
              4: Fp8WireCodec(token_dim=2, format=fmt, min_values_per_scale=64)}
    return lambda tensor: by_dim.get(tensor.dim())


def stale_kv_format(fp8: Fp8Config | None, device: torch.device) -> torch.dtype | None:
    """The FP8 format PipeFusion's stale K/V buffers are held in (None: the working dtype)."""
    return fp8_dtype(device) if fp8 is not None and fp8.stale_kv else None


def quantize_transformer(transformer: torch.nn.Module, block_lists: list[str]) -> int:
    """FP8 weights for the Linear layers of the block lists; returns how many layers."""
    from ..quant.fp8_linear import quantize_block_lists

    check_fp8_gemm(next(transformer.parameters()).device)
    return quantize_block_lists(transformer, block_lists)
