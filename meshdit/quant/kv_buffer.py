"""PipeFusion's stale K/V held in FP8 (`--fp8-stale-kv`): about a quarter of float32's bytes, half of bfloat16's.

The buffers are PipeFusion's largest memory cost (every layer of a stage, K and V, the whole sequence:
~1.6 GB for FLUX.1-dev's half at 4096 tokens in bfloat16, more than all its activations). A patch reads
them as of its previous step anyway, so they are stored quantized: e4m3 values with one float32 scale per
(batch, head, token) over head_dim, the granularity at which attention kernels scale K and V. A forward
decodes the whole buffer once, overwrites its own patch's tokens with their fresh working-dtype values,
and attends; only what other patches read later goes through FP8.
"""
from __future__ import annotations

import torch

from .quantize import dequantize, quantize_rows


class Fp8KVBuffer:
    """One K or V buffer [B, H, S, D]: FP8 values [B, H, S, D] and float32 scales [B, H, S, 1]."""

    def __init__(self, values: torch.Tensor, scales: torch.Tensor, dtype: torch.dtype) -> None:
        self.values = values
        self.scales = scales
        self.dtype = dtype  # what read() returns: the model's working dtype

    @classmethod
    def of(cls, x: torch.Tensor, fmt: torch.dtype) -> "Fp8KVBuffer":
        return cls(*quantize_rows(x, fmt), x.dtype)

    @classmethod
    def zeros(cls, like: torch.Tensor, tokens: int, fmt: torch.dtype) -> "Fp8KVBuffer":
        """A buffer of `tokens` tokens shaped like `like` [B, H, *, D], reading as zeros."""
        b, h, _, d = like.shape
        return cls(torch.zeros(b, h, tokens, d, dtype=fmt, device=like.device),
                   torch.zeros(b, h, tokens, 1, dtype=torch.float32, device=like.device), like.dtype)

    def read(self) -> torch.Tensor:
        """The whole buffer decoded: a new [B, H, S, D] tensor in the working dtype."""
        return dequantize(self.values, self.scales, self.dtype)

    def write(self, at: int, x: torch.Tensor) -> None:
        """Stores x [B, H, n, D] as tokens [at, at + n)."""
        q, scale = quantize_rows(x, self.values.dtype)
        self.values.narrow(2, at, x.shape[2]).copy_(q)
        self.scales.narrow(2, at, x.shape[2]).copy_(scale)

    @property
    def nbytes(self) -> int:
        return self.values.nbytes + self.scales.nbytes
