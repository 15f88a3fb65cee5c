"""Ulysses all-to-all: trade a sequence shard of all heads for all of the sequence of a head shard."""
from __future__ import annotations

import torch
from torch.distributed import ProcessGroup

from ..distributed.comm import all_to_all_chunks, all_to_all_chunks_async, group_rank, split_sizes


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


def head_chunks(heads: list[int], chunks: int) -> list[list[tuple[int, int]]]:
    """Per chunk c, per rank j: (first head, count) of rank j's heads that chunk c carries.

    Rank j's heads (split_sizes of H) are cut again with split_sizes, so chunk c of every rank is a
    contiguous run inside that rank's heads; [c][j] for c in chunks, j in ranks."""
    starts = [sum(heads[:j]) for j in range(len(heads))]
    cuts = [split_sizes(h, chunks) for h in heads]
    return [[(starts[j] + sum(cuts[j][:c]), cuts[j][c]) for j in range(len(heads))] for c in range(chunks)]


def pipelined_ulysses_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, group: ProcessGroup,
                                seq_lens: list[int], attend, chunks: int = 2) -> torch.Tensor:
    """Ulysses attention with its messages overlapped by attention: heads travel in `chunks` groups.

    q, k, v: [B, H, seq_lens[me], D] (one dtype, working precision) -> [B, H, seq_lens[me], D].
    Every chunk's q/k/v all-to-all is posted at once; chunk c's attention runs while chunk c+1's
    inputs and chunk c-1's outputs travel. Attention is per head, so this equals seq_to_heads,
    attend and heads_to_seq on all heads (same kernel, each head's rows the same). Needs
    min(heads per rank) >= chunks. NOTE: every rank of `group` must call it.
    """
    b, h, s, d = q.shape
    me = group_rank(group)
    plan = head_chunks(split_sizes(h, len(seq_lens)), chunks)
    inputs = []
    for per_rank in plan:  # to rank j: [3, B, heads of chunk c on rank j, S_me, D]
        send = [torch.stack([x.narrow(1, h0, n) for x in (q, k, v)]) for h0, n in per_rank]
        n_me = per_rank[me][1]
        inputs.append(all_to_all_chunks_async(send, [(3, b, n_me, n, d) for n in seq_lens], group))
    outputs = []
    for c, per_rank in enumerate(plan):
        q_c, k_c, v_c = torch.cat(inputs[c].wait(), dim=3).unbind(0)  # [B, heads_c, S, D] each
        out = attend(q_c, k_c, v_c)  # [B, heads_c, S, D]
        send = list(out.split(seq_lens, dim=2))  # to rank j: its tokens of my chunk-c heads
        outputs.append(all_to_all_chunks_async(send, [(b, n, seq_lens[me], d) for _, n in per_rank], group))
    received = [pending.wait() for pending in outputs]  # [c][j]: [B, heads of chunk c on rank j, S_me, D]
    return torch.cat([received[c][j] for j in range(len(seq_lens)) for c in range(chunks)], dim=1)
