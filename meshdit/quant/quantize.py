"""Scaled FP8 quantization: per row (output channel or token), per token position, per block.

Every function returns the FP8 values and the float32 scales with x ≈ q.float() * scale.
Values are clamped to the format's range first: casting a too-large value to
e4m3fn gives NaN, not the maximum.
"""
from __future__ import annotations

import torch

from .formats import E4M3FN, fp8_max

_TINY = 1e-12  # an all-zero row still gets a usable (positive) scale


def _scaled(x: torch.Tensor, scale: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    limit = fp8_max(dtype)
    return (x.float() / scale).clamp_(-limit, limit).to(dtype)


def quantize_rows(x: torch.Tensor, dtype: torch.dtype = E4M3FN) -> tuple[torch.Tensor, torch.Tensor]:
    """One scale per row over the last dim: [..., K] -> q [..., K], scale [..., 1]."""
    scale = x.detach().abs().amax(dim=-1, keepdim=True).float().clamp_min(_TINY) / fp8_max(dtype)
    return _scaled(x, scale, dtype), scale


def quantize_blocks(x: torch.Tensor, block: int, dim: int, dtype: torch.dtype = E4M3FN
                    ) -> tuple[torch.Tensor, torch.Tensor]:
    """One scale per run of `block` indices along `dim`, over that run and every later dim.

    x: [B, H, S, D] with dim=2 gives a scale per (batch, head, block of tokens), like FP8 attention
    kernels. Returns q (x's shape) and scale broadcastable to x.
    """
    dim = dim % x.dim()
    n = x.shape[dim]
    pad = (-n) % block
    xf = x.float()
    if pad:
        shape = list(x.shape)
        shape[dim] = pad
        xf = torch.cat([xf, xf.new_zeros(shape)], dim=dim)
    blocks = xf.unflatten(dim, (-1, block))  # [..., n_blocks, block, ...]
    reduce = tuple(range(dim + 1, blocks.dim()))
    scale = blocks.abs().amax(dim=reduce, keepdim=True).clamp_min(_TINY) / fp8_max(dtype)
    scale = scale.expand_as(blocks).flatten(dim, dim + 1).narrow(dim, 0, n)
    # keep one scale per block along the trailing dims so it broadcasts against x
    scale = scale[(slice(None),) * (dim + 1) + (slice(0, 1),) * (x.dim() - dim - 1)]
    return _scaled(x, scale, dtype), scale


def dequantize(q: torch.Tensor, scale: torch.Tensor, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    return (q.float() * scale).to(dtype)


def fake_quantize_blocks(x: torch.Tensor, block: int, dim: int, dtype: torch.dtype = E4M3FN) -> torch.Tensor:
    """x after a round trip through FP8 with per-block scales (float32): the values a kernel would see."""
    return dequantize(*quantize_blocks(x, block, dim, dtype))
