"""Collectives with uneven shapes, and a count of the bytes each one sends.

Every function takes the process group it runs on and skips communication on a
group of one rank. This is the one place a wire codec (FP8, meshdit.quant.codec)
is applied: a caller passes `codec`, and what travels and is counted is its bytes.
"""
from __future__ import annotations

from collections import defaultdict

import torch
import torch.distributed as dist

from .timeline import timeline


class CommStats:
    """Bytes this rank sent, per kind of collective (for benchmarks).

    bf16_bytes counts what the same payloads would have cost in bfloat16, so an
    FP8 run reports its saving against the usual GPU working dtype.
    """

    def __init__(self) -> None:
        self.bytes_sent: dict[str, int] = defaultdict(int)
        self.bf16_bytes: dict[str, int] = defaultdict(int)

    def add(self, kind: str, nbytes: int, numel: int | None = None) -> None:
        self.bytes_sent[kind] += int(nbytes)
        if numel is not None:
            self.bf16_bytes[kind] += 2 * int(numel)

    def reset(self) -> None:
        self.bytes_sent.clear()
        self.bf16_bytes.clear()

    def total(self) -> int:
        return sum(self.bytes_sent.values())


comm_stats = CommStats()


def split_sizes(total: int, parts: int) -> list[int]:
    """Sizes of torch.tensor_split(x, parts): the first total % parts pieces are one longer."""
    base, extra = divmod(total, parts)
    return [base + (1 if i < extra else 0) for i in range(parts)]


def all_to_all_chunks(
    send: list[torch.Tensor], recv_shapes: list[tuple[int, ...]], group: dist.ProcessGroup, codec=None
) -> list[torch.Tensor]:
    """send[j] goes to group rank j; returns the tensors received from each rank.

    Shapes may differ per peer: everything travels as one flat buffer with
    element-count splits (gloo and NCCL both take uneven splits).
    """
    dtype, device = send[0].dtype, send[0].device
    if codec is not None:
        return _all_to_all_encoded(send, recv_shapes, group, codec)
    in_splits = [t.numel() for t in send]
    out_splits = [int(torch.Size(s).numel()) for s in recv_shapes]
    flat_in = torch.cat([t.reshape(-1) for t in send])
    flat_out = torch.empty(sum(out_splits), dtype=dtype, device=device)
    me = dist.get_rank(group)
    comm_stats.add("all_to_all", (sum(in_splits) - in_splits[me]) * flat_in.element_size(),
                   sum(in_splits) - in_splits[me])
    with timeline.span("all_to_all"):
        dist.all_to_all_single(flat_out, flat_in, out_splits, in_splits, group=group)
    return [c.view(s) for c, s in zip(flat_out.split(out_splits), recv_shapes)]


def _all_to_all_encoded(send, recv_shapes, group, codec) -> list[torch.Tensor]:
    """all_to_all_chunks with each chunk sent as codec bytes (its own chunk is never encoded)."""
    me = dist.get_rank(group)
    wires = [codec.encode(t) if j != me else torch.empty(0, dtype=torch.uint8, device=t.device)
             for j, t in enumerate(send)]
    in_splits = [w.numel() for w in wires]
    out_splits = [codec.wire_bytes(s) if j != me else 0 for j, s in enumerate(recv_shapes)]
    flat_out = torch.empty(sum(out_splits), dtype=torch.uint8, device=send[0].device)
    comm_stats.add("all_to_all", sum(in_splits), sum(t.numel() for j, t in enumerate(send) if j != me))
    with timeline.span("all_to_all"):
        dist.all_to_all_single(flat_out, torch.cat(wires), out_splits, in_splits, group=group)
    parts = flat_out.split(out_splits)
    return [send[me].contiguous() if j == me else codec.decode(parts[j], s, send[me].dtype)
            for j, s in enumerate(recv_shapes)]


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
    comm_stats.add("all_gather", x.numel() * x.element_size() * (world - 1), x.numel() * (world - 1))
    with timeline.span("all_gather"):
        dist.all_gather(parts, x, group=group)
    return torch.cat([p.narrow(dim, 0, n) for p, n in zip(parts, lens)], dim=dim)


class RingExchange:
    """Sends a tensor to the next rank of a ring while receiving the previous rank's.

    Sends and receives are posted together (batch_isend_irecv) so that gloo, whose
    sends wait for the matching receive, cannot deadlock; the caller computes on
    its current block between start() and wait().
    """

    def __init__(self, group: dist.ProcessGroup, codec=None) -> None:
        self.group = group
        self.codec = codec
        ranks = dist.get_process_group_ranks(group)
        me = dist.get_rank(group)
        self.next_rank = ranks[(me + 1) % len(ranks)]
        self.prev_rank = ranks[(me - 1) % len(ranks)]
        self._reqs: list = []
        self._recv: torch.Tensor | None = None

    def start(self, send: torch.Tensor, recv_shape: tuple[int, ...]) -> None:
        self._shape, self._dtype = recv_shape, send.dtype
        numel = send.numel()
        if self.codec is not None:
            send = self.codec.encode(send)
            self._recv = torch.empty(self.codec.wire_bytes(recv_shape), dtype=torch.uint8, device=send.device)
        else:
            send = send.contiguous()
            self._recv = torch.empty(recv_shape, dtype=send.dtype, device=send.device)
        comm_stats.add("ring_p2p", send.numel() * send.element_size(), numel)
        ops = [
            dist.P2POp(dist.isend, send, self.next_rank, self.group),
            dist.P2POp(dist.irecv, self._recv, self.prev_rank, self.group),
        ]
        with timeline.span("ring_post", self.prev_rank):
            self._reqs = dist.batch_isend_irecv(ops)

    def wait(self) -> torch.Tensor:
        with timeline.span("ring_wait", self.prev_rank):
            for req in self._reqs:
                req.wait()
        recv, self._recv, self._reqs = self._recv, None, []
        if self.codec is not None:
            recv = self.codec.decode(recv, self._shape, self._dtype)
        return recv


def isend_tensor(tensor: torch.Tensor, dst: int, group: dist.ProcessGroup, codec=None, kind: str = "pipe_p2p"):
    """Posts a send of `tensor` (a private copy, or its codec bytes) to global rank dst.

    Returns (work, buffer): keep the buffer alive until the work completes.
    """
    numel = tensor.numel()
    buffer = codec.encode(tensor) if codec is not None else tensor.detach().contiguous().clone()
    comm_stats.add(kind, buffer.numel() * buffer.element_size(), numel)
    with timeline.span("send_post", dst):
        return dist.isend(buffer, dst, group=group), buffer


def recv_tensor(shape, dtype: torch.dtype, device, src: int, group: dist.ProcessGroup, codec=None) -> torch.Tensor:
    """Receives what isend_tensor(…, codec) sent from global rank src."""
    if codec is None:
        buffer = torch.empty(shape, dtype=dtype, device=device)
        with timeline.span("recv", src):
            dist.recv(buffer, src, group=group)
        return buffer
    wire = torch.empty(codec.wire_bytes(shape), dtype=torch.uint8, device=device)
    with timeline.span("recv", src):
        dist.recv(wire, src, group=group)
    return codec.decode(wire, shape, dtype)
