"""The change signal every rank agrees on: relative L1 change per image, from global sums.

Each rank holds some of an image's tokens (sequence parallelism shards them, unevenly when the count does not
divide). The serial value is sum|delta| / sum|prev| over all of the image's tokens; summing each rank's part in
float64 and all-reducing the two sums over the ranks that share the image gives that value on every rank
(up to float64 rounding), so every rank takes the one-process decision. Peers average per-rank ratios of means
instead (`averaged_means_change`, kept to show where that differs).
"""
from __future__ import annotations

import torch

from ..distributed.comm import all_reduce


def relative_change(current: torch.Tensor, previous: torch.Tensor, group) -> torch.Tensor:
    """Per image (row), sum|current - previous| / sum|previous| over its tokens on every rank of `group`.

    current, previous: [B, S/sp, ...] this rank's tokens of B images. Returns [B] float64, the same on every rank."""
    delta = (current - previous).abs().flatten(1).sum(1, dtype=torch.float64)  # [B]
    base = previous.abs().flatten(1).sum(1, dtype=torch.float64)  # [B]
    sums = torch.stack([delta, base])  # [2, B]
    all_reduce(sums, group, "cache_signal_all_reduce")
    return sums[0] / sums[1].clamp_min(torch.finfo(torch.float64).tiny)


def averaged_means_change(current: torch.Tensor, previous: torch.Tensor, group) -> torch.Tensor:
    """The rule ParaAttention / cache-dit / older xDiT use under sequence parallelism: each rank's
    mean|delta| / mean|previous| over its own tokens, averaged over the ranks. Differs from relative_change
    when the shards are uneven or their magnitudes differ. Kept for tests and the benchmark, never used."""
    delta = (current - previous).abs().flatten(1).mean(1, dtype=torch.float64)  # [B]
    base = previous.abs().flatten(1).mean(1, dtype=torch.float64)  # [B]
    ratio = delta / base
    all_reduce(ratio, group, "cache_signal_all_reduce")
    size = 1 if group is None else torch.distributed.get_world_size(group)
    return ratio / size
