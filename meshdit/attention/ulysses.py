"""Ulysses all-to-all: trade a sequence shard of all heads for all of the sequence of a head shard."""
from __future__ import annotations

import torch
from torch.distributed import ProcessGroup

from ..distributed.comm import all_to_all_chunks, all_to_all_flat_async, group_rank, split_sizes


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
    """Ulysses attention over a token-major wire, heads in `chunks` groups (1: one all-to-all each way;
    more: the groups' messages overlap the other groups' attention).

    q, k, v: [B, H, seq_lens[me], D] (one dtype, working precision) -> [B, H, seq_lens[me], D], a view of a
    [B, seq_lens[me], H, D] tensor (the layout diffusers' processors flatten, so they need no copy).
    Every chunk's q/k/v all-to-all is posted at once; chunk c's attention runs while chunk c+1's
    inputs and chunk c-1's outputs travel. Attention is per head, so this equals seq_to_heads,
    attend and heads_to_seq on all heads (same kernel, each head's rows the same). Needs
    min(heads per rank) >= chunks. NOTE: every rank of `group` must call it.

    The wire is token-major ([tokens, B, 3, heads, D] in, [tokens, B, heads, D] out): what arrives from
    the ranks, in rank order, is already the whole sequence, so attention reads the receive buffer as it
    is (strided q/k/v), and each element is copied once on the way in and once on the way out.
    """
    b, h, s, d = q.shape
    me, total = group_rank(group), sum(seq_lens)
    plan = head_chunks(split_sizes(h, len(seq_lens)), chunks)
    inputs = []
    for per_rank in plan:
        flat = q.new_empty(s * b * 3 * sum(n for _, n in per_rank) * d)
        splits = [s * b * 3 * n * d for _, n in per_rank]
        for (h0, n), piece in zip(per_rank, flat.split(splits)):  # to rank j: [S_me, B, 3, n_j, D]
            piece = piece.view(s, b, 3, n, d)
            for i, x in enumerate((q, k, v)):
                piece[:, :, i].copy_(x.narrow(1, h0, n).permute(2, 0, 1, 3))
        n_me = per_rank[me][1]
        inputs.append(all_to_all_flat_async(flat, splits, [m * b * 3 * n_me * d for m in seq_lens], group))
    outputs = []
    for c, per_rank in enumerate(plan):
        n_me = per_rank[me][1]
        qkv = inputs[c].wait_flat().view(total, b, 3, n_me, d)  # every rank's tokens, in rank order
        out = attend(*(qkv[:, :, i].permute(1, 2, 0, 3) for i in range(3)))  # [B, n_me, S, D]
        flat = out.permute(2, 0, 1, 3).reshape(-1)  # [S, B, n_me, D]: rank j's tokens are the j-th run
        outputs.append(all_to_all_flat_async(flat, [m * b * n_me * d for m in seq_lens],
                                             [s * b * n * d for _, n in per_rank], group))
    merged = q.new_empty(b, s, h, d)
    for c, per_rank in enumerate(plan):
        received = outputs[c].wait_flat().split([s * b * n * d for _, n in per_rank])
        for (h0, n), piece in zip(per_rank, received):  # from rank j: [S_me, B, n_j, D] of its chunk-c heads
            merged[:, :, h0:h0 + n].copy_(piece.view(s, b, n, d).transpose(0, 1))
    return merged.permute(0, 2, 1, 3)  # [B, H, S_me, D]
