"""Collectives with uneven shapes, and a count of the bytes each one sends.

Every function takes the process group it runs on and skips communication on a
group of one rank.
"""
from __future__ import annotations

from collections import defaultdict

import torch
import torch.distributed as dist


class CommStats:
    """Bytes this rank sent, per kind of collective (for benchmarks)."""

    def __init__(self) -> None:
        self.bytes_sent: dict[str, int] = defaultdict(int)

    def add(self, kind: str, nbytes: int) -> None:
        self.bytes_sent[kind] += int(nbytes)

    def reset(self) -> None:
        self.bytes_sent.clear()

    def total(self) -> int:
        return sum(self.bytes_sent.values())


comm_stats = CommStats()


def split_sizes(total: int, parts: int) -> list[int]:
    """Sizes of torch.tensor_split(x, parts): the first total % parts pieces are one longer."""
    base, extra = divmod(total, parts)
    return [base + (1 if i < extra else 0) for i in range(parts)]


def all_to_all_chunks(
    send: list[torch.Tensor], recv_shapes: list[tuple[int, ...]], group: dist.ProcessGroup
) -> list[torch.Tensor]:
    """send[j] goes to group rank j; returns the tensors received from each rank.

    Shapes may differ per peer: everything travels as one flat buffer with
    element-count splits (gloo and NCCL both take uneven splits).
    """
    dtype, device = send[0].dtype, send[0].device
    in_splits = [t.numel() for t in send]
    out_splits = [int(torch.Size(s).numel()) for s in recv_shapes]
    flat_in = torch.cat([t.reshape(-1) for t in send])
    flat_out = torch.empty(sum(out_splits), dtype=dtype, device=device)
    me = dist.get_rank(group)
    comm_stats.add("all_to_all", (sum(in_splits) - in_splits[me]) * flat_in.element_size())
    dist.all_to_all_single(flat_out, flat_in, out_splits, in_splits, group=group)
    return [c.view(s) for c, s in zip(flat_out.split(out_splits), recv_shapes)]


def all_gather_uneven(x: torch.Tensor, dim: int, lens: list[int], group: dist.ProcessGroup) -> torch.Tensor:
    """Concatenates every rank's x along dim; rank j's x has lens[j] rows on dim."""
    world = len(lens)
    if world == 1:
        return x
    dim = dim % x.dim()
    longest = max(lens)
    if x.shape[dim] < longest:  # all_gather needs equal shapes: pad, then trim
        pad_shape = list(x.shape)
        pad_shape[dim] = longest - x.shape[dim]
        x = torch.cat([x, x.new_zeros(pad_shape)], dim=dim)
    x = x.contiguous()
    parts = [torch.empty_like(x) for _ in range(world)]
    comm_stats.add("all_gather", x.numel() * x.element_size() * (world - 1))
    dist.all_gather(parts, x, group=group)
    return torch.cat([p.narrow(dim, 0, n) for p, n in zip(parts, lens)], dim=dim)


class RingExchange:
    """Sends a tensor to the next rank of a ring while receiving the previous rank's.

    Sends and receives are posted together (batch_isend_irecv) so that gloo, whose
    sends wait for the matching receive, cannot deadlock; the caller computes on
    its current block between start() and wait().
    """

    def __init__(self, group: dist.ProcessGroup) -> None:
        self.group = group
        ranks = dist.get_process_group_ranks(group)
        me = dist.get_rank(group)
        self.next_rank = ranks[(me + 1) % len(ranks)]
        self.prev_rank = ranks[(me - 1) % len(ranks)]
        self._reqs: list = []
        self._recv: torch.Tensor | None = None

    def start(self, send: torch.Tensor, recv_shape: tuple[int, ...]) -> None:
        send = send.contiguous()
        self._recv = torch.empty(recv_shape, dtype=send.dtype, device=send.device)
        comm_stats.add("ring_p2p", send.numel() * send.element_size())
        ops = [
            dist.P2POp(dist.isend, send, self.next_rank, self.group),
            dist.P2POp(dist.irecv, self._recv, self.prev_rank, self.group),
        ]
        self._reqs = dist.batch_isend_irecv(ops)

    def wait(self) -> torch.Tensor:
        for req in self._reqs:
            req.wait()
        recv, self._recv, self._reqs = self._recv, None, []
        return recv
