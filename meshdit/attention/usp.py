"""Unified sequence parallel attention: Ulysses inside, Ring outside (USP).

The SP ranks of one mesh are ordered ring-major: SP rank = ring_index * U +
ulysses_index. Token shard j lives on SP rank j, so a Ulysses group holds a
contiguous run of shards, and after its all-to-all each rank holds that run for
its head shard; the ring then passes those runs around.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
from torch.distributed import ProcessGroup

from ..distributed.comm import group_rank
from .kernels import attention_with_lse
from .ring import ring_attention
from .ulysses import heads_to_seq, pipelined_ulysses_attention, seq_to_heads, seq_to_heads_together

ULYSSES_CHUNKS = 1
"""Head groups that Ulysses-only attention sends one after another, so that messages overlap attention
(1: one all-to-all for q/k/v and one for the output, nothing overlapped). 1 by default: on gloo two
groups were slower (twice the collectives, each a rendezvous; docs/figures.md); not measured on NCCL."""


@dataclass(frozen=True)
class SequenceGroups:
    """The two process groups of sequence parallelism and this rank's place in them."""

    ulysses_group: ProcessGroup
    ulysses_size: int
    ring_group: ProcessGroup
    ring_size: int


@dataclass(frozen=True)
class WireCodecs:
    """Codecs for what sequence parallelism sends (None: exact, in the working dtype)."""

    q: object = None  # Ulysses all-to-alls, [B, H, S, D]
    k: object = None
    v: object = None
    out: object = None
    ring: object = None  # ring K/V blocks, [2, B, H, S, D]


EXACT = WireCodecs()


def usp_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    groups: SequenceGroups,
    seq_lens: list[int],
    scale: float | None,
    local_attention,
    lse_attention=attention_with_lse,
    codecs: WireCodecs = EXACT,
) -> torch.Tensor:
    """Exact attention over the full sequence from local shards.

    q, k, v: [B, H, seq_lens[sp_rank], D]; seq_lens holds every SP rank's length.
    `local_attention(q, k, v, scale)` is the plain kernel used when no ring is involved,
    `lse_attention` the one that also returns the LSE (ring); `codecs` encode the wire.
    NOTE: every SP rank must call this for the same layer with the same seq_lens.
    """
    layout = UspLayout.of(groups, seq_lens)
    num_heads = q.shape[1]
    if _pipelines(q, k, v, groups, codecs):
        return pipelined_ulysses_attention(q, k, v, groups.ulysses_group, seq_lens,
                                           lambda q_, k_, v_: local_attention(q_, k_, v_, scale), ULYSSES_CHUNKS)
    q, k, v = ulysses_in(q, k, v, groups, layout, codecs)  # [B, H/U, run_lens[ring_me], D]
    if groups.ring_size > 1:
        out = ring_attention(q, k, v, groups.ring_group, layout.run_lens, scale, codecs.ring, lse_attention)
    else:
        out = local_attention(q, k, v, scale)
    return ulysses_out(out, groups, layout, num_heads, codecs)  # [B, H, seq_lens[sp_rank], D]


def _pipelines(q, k, v, groups: SequenceGroups, codecs: WireCodecs) -> bool:
    """Ulysses alone, exact wire, q/k/v alike, and every rank holding at least one head per chunk: the
    token-major all-to-alls of `pipelined_ulysses_attention` (in ULYSSES_CHUNKS head groups)."""
    return (groups.ring_size == 1 and groups.ulysses_size > 1 and codecs == EXACT
            and q.shape == k.shape == v.shape and q.dtype == k.dtype == v.dtype
            and q.shape[1] // groups.ulysses_size >= ULYSSES_CHUNKS)


@dataclass(frozen=True)
class UspLayout:
    """Where the tokens are: SP rank j = ring index * U + Ulysses index holds seq_lens[j]."""

    member_lens: list[int]
    """Tokens of each rank of this rank's Ulysses group (what its all-to-all concatenates)."""
    run_lens: list[int]
    """Per ring index: the tokens its Ulysses group holds (the run a ring rank passes on)."""

    @classmethod
    def of(cls, groups: SequenceGroups, seq_lens: list[int]) -> "UspLayout":
        u, r = groups.ulysses_size, groups.ring_size
        ring_me = group_rank(groups.ring_group) if r > 1 else 0
        return cls(seq_lens[ring_me * u:(ring_me + 1) * u], [sum(seq_lens[g * u:(g + 1) * u]) for g in range(r)])


def ulysses_in(q, k, v, groups: SequenceGroups, layout: UspLayout, codecs: WireCodecs = EXACT):
    """[B, H, S_me, D] each -> [B, H/U, run of my Ulysses group, D] each (unchanged when U = 1)."""
    if groups.ulysses_size == 1:
        return q, k, v
    if codecs.q is codecs.k is codecs.v is None and q.shape == k.shape == v.shape and q.dtype == k.dtype == v.dtype:
        return tuple(seq_to_heads_together([q, k, v], groups.ulysses_group, layout.member_lens))
    return tuple(seq_to_heads(t, groups.ulysses_group, layout.member_lens, c)
                 for t, c in ((q, codecs.q), (k, codecs.k), (v, codecs.v)))


def ulysses_out(out: torch.Tensor, groups: SequenceGroups, layout: UspLayout, num_heads: int,
                codecs: WireCodecs = EXACT) -> torch.Tensor:
    """Inverse of ulysses_in for the attention output: [B, H/U, run, D] -> [B, H, S_me, D]."""
    if groups.ulysses_size == 1:
        return out
    return heads_to_seq(out, groups.ulysses_group, layout.member_lens, num_heads, codecs.out)
