"""FP8 wire codec: a tensor travels as bytes, FP8 values plus one bfloat16 scale per token position.

gloo cannot send float8 tensors, so payload and scales share one uint8 buffer:
[numel FP8 bytes | tokens × 2 scale bytes]. A bfloat16 scale keeps float32's
range at half the bytes; the values are quantized with the rounded scale, so
rounding it costs no accuracy.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from .formats import E4M3FN, fp8_max

SCALE_DTYPE = torch.bfloat16
SCALE_BYTES = 2


@dataclass(frozen=True)
class Fp8WireCodec:
    token_dim: int
    """The tensor dim that indexes tokens: each index along it gets one scale over all other dims."""
    format: torch.dtype = E4M3FN
    min_values_per_scale: int = 1
    """Tokens with few values each (e.g. 16 latent channels) share a scale, so scales stay a small overhead."""

    def _group(self, shape: torch.Size) -> tuple[int, int]:
        """(tokens per scale, scales) for a tensor of `shape`."""
        tokens = shape[self.token_dim]
        per_token = shape.numel() // max(tokens, 1)
        group = max(1, math.ceil(self.min_values_per_scale / max(per_token, 1)))
        return group, math.ceil(tokens / group)

    def wire_bytes(self, shape: tuple[int, ...]) -> int:
        shape = torch.Size(shape)
        return shape.numel() + self._group(shape)[1] * SCALE_BYTES

    def encode(self, x: torch.Tensor) -> torch.Tensor:
        """x -> uint8 [wire_bytes(x.shape)]."""
        group, n_scales = self._group(x.shape)
        rows = x.detach().movedim(self.token_dim, 0).float().reshape(x.shape[self.token_dim], -1)  # [S, N]
        amax = rows.abs().amax(dim=1)  # [S]
        amax = torch.nn.functional.pad(amax, (0, n_scales * group - amax.numel())).view(n_scales, group).amax(1)
        scale = (amax.clamp_min(1e-12) / fp8_max(self.format)).to(SCALE_DTYPE)  # [S / group]
        limit = fp8_max(self.format)
        q = (rows / scale.float().repeat_interleave(group)[: rows.shape[0], None]).clamp_(-limit, limit)
        return torch.cat([q.to(self.format).reshape(-1).view(torch.uint8), scale.view(torch.uint8)])

    def decode(self, wire: torch.Tensor, shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
        """uint8 [wire_bytes(shape)] -> tensor of `shape` and `dtype`."""
        shape = torch.Size(shape)
        group, _ = self._group(shape)
        moved = list(shape)
        moved.insert(0, moved.pop(self.token_dim))  # the token dim first, as encoded
        n = shape.numel()
        q = wire[:n].view(self.format).reshape(moved[0], -1)  # [S, N]
        scale = wire[n:].view(SCALE_DTYPE).float().repeat_interleave(group)[: moved[0], None]
        return (q.float() * scale).to(dtype).reshape(moved).movedim(0, self.token_dim)
