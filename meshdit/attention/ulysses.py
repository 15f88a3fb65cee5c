"""Ulysses all-to-all: trade a sequence shard of all heads for all of the sequence of a head shard."""
from __future__ import annotations

import torch
from torch.distributed import ProcessGroup

from ..distributed.comm import all_to_all_chunks, group_rank, split_sizes


def seq_to_heads(x: torch.Tensor, group: ProcessGroup, seq_lens: list[int], codec=None) -> torch.Tensor:
    """[B, H, seq_lens[me], D] -> [B, H_me, sum(seq_lens), D].

    Heads split like torch.tensor_split (uneven when H does not divide), and the
    sequence comes back in rank order; `codec` (e.g. FP8) encodes what travels.
    NOTE: every rank of `group` must call it.
    """
    b, h, s, d = x.shape
    me = group_rank(group)
    heads = split_sizes(h, len(seq_lens))
    send = list(x.split(heads, dim=1))  # to rank j: [B, H_j, S_me, D]
    recv_shapes = [(b, heads[me], n, d) for n in seq_lens]
    return torch.cat(all_to_all_chunks(send, recv_shapes, group, codec), dim=2)


def seq_to_heads_together(xs: list[torch.Tensor], group: ProcessGroup, seq_lens: list[int]) -> list[torch.Tensor]:
    """seq_to_heads of several same-shape tensors (q, k, v) in one all-to-all instead of one each: the same
    bytes, a third of the collectives (each a rendezvous of every rank of the group). Exact dtype only.
    NOTE: every rank of `group` must call it."""
    b, h, s, d = xs[0].shape
    me = group_rank(group)
    heads = split_sizes(h, len(seq_lens))
    parts = [x.split(heads, dim=1) for x in xs]
    send = [torch.stack([p[j] for p in parts]) for j in range(len(seq_lens))]  # to rank j: [N, B, H_j, S_me, D]
    recv_shapes = [(len(xs), b, heads[me], n, d) for n in seq_lens]
    return list(torch.cat(all_to_all_chunks(send, recv_shapes, group), dim=3).unbind(0))  # N x [B, H_me, S, D]


def heads_to_seq(x: torch.Tensor, group: ProcessGroup, seq_lens: list[int], num_heads: int,
                 codec=None) -> torch.Tensor:
    """Inverse of seq_to_heads: [B, H_me, sum(seq_lens), D] -> [B, H, seq_lens[me], D]."""
    b, _, _, d = x.shape
    me = group_rank(group)
    heads = split_sizes(num_heads, len(seq_lens))
    send = list(x.split(seq_lens, dim=2))  # to rank j: its sequence shard of my heads
    recv_shapes = [(b, heads[j], seq_lens[me], d) for j in range(len(seq_lens))]
    return torch.cat(all_to_all_chunks(send, recv_shapes, group, codec), dim=1)
