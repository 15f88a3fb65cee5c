"""Collectives: uneven all-to-all and all-gather, equal all-gather, all-reduce, broadcast.

NOTE: every rank of `group` must call the same collective, in the same order, with
matching shapes (each function states which shapes must agree).
"""
from __future__ import annotations

import pickle

import torch
import torch.distributed as dist
from torch.distributed import ProcessGroup

from ..timeline import timeline
from .stats import comm_stats

_OPS = {"sum": dist.ReduceOp.SUM, "max": dist.ReduceOp.MAX}


def group_size(group: dist.ProcessGroup | None) -> int:
    """Ranks in `group`; None is this process alone (no process group needed)."""
    return 1 if group is None else dist.get_world_size(group)


def group_rank(group: dist.ProcessGroup | None) -> int:
    """This rank's index in `group` (0 when alone)."""
    return 0 if group is None else dist.get_rank(group)


def split_sizes(total: int, parts: int) -> list[int]:
    """Sizes of torch.tensor_split(x, parts): the first total % parts pieces are one longer."""
    base, extra = divmod(total, parts)
    return [base + (1 if i < extra else 0) for i in range(parts)]


def all_to_all_chunks(
    send: list[torch.Tensor], recv_shapes: list[tuple[int, ...]], group: dist.ProcessGroup | None, codec=None
) -> list[torch.Tensor]:
    """send[j] goes to group rank j; returns the tensors received from each rank.

    Shapes may differ per peer: everything travels as one flat buffer with
    element-count splits (gloo and NCCL both take uneven splits). With `codec`
    each chunk but this rank's own travels as the codec's bytes.
    """
    if len(send) == 1:
        return [send[0]]
    if codec is not None:
        return _all_to_all_encoded(send, recv_shapes, group, codec)
    dtype, device = send[0].dtype, send[0].device
    in_splits = [t.numel() for t in send]
    out_splits = [int(torch.Size(s).numel()) for s in recv_shapes]
    flat_in = torch.cat([t.reshape(-1) for t in send])
    flat_out = torch.empty(sum(out_splits), dtype=dtype, device=device)
    me = group_rank(group)
    comm_stats.add("all_to_all", (sum(in_splits) - in_splits[me]) * flat_in.element_size(),
                   sum(in_splits) - in_splits[me])
    with timeline.span("all_to_all"):
        dist.all_to_all_single(flat_out, flat_in, out_splits, in_splits, group=group)
    return [c.view(s) for c, s in zip(flat_out.split(out_splits), recv_shapes)]


class PendingAllToAll:
    """An all-to-all in flight (all_to_all_flat_async); wait_flat() gives the whole receive buffer."""

    def __init__(self, work, flat_out: torch.Tensor, keep: torch.Tensor):
        self._work, self._flat_out = work, flat_out
        self._keep = keep  # the send buffer must live until the work completes

    def wait_flat(self) -> torch.Tensor:
        if self._work is not None:
            with timeline.span("all_to_all"):
                self._work.wait()
            self._work = self._keep = None
        return self._flat_out


def all_to_all_flat_async(flat_in: torch.Tensor, in_splits: list[int], out_splits: list[int],
                          group: dist.ProcessGroup | None) -> PendingAllToAll:
    """Posts an all-to-all of one flat buffer without waiting, so the caller computes meanwhile: flat_in's
    consecutive in_splits[j] elements go to rank j, and rank j's arrive as the receive buffer's consecutive
    out_splits[j] (wait_flat). The caller lays out both buffers: a send buffer filled in place copies each
    element once, and a layout whose pieces join in rank order (token-major: each rank's tokens follow the
    previous rank's) is read where it arrives, without a concatenation.

    NOTE: every rank of `group` must post the same all-to-alls in the same order; waiting may be later.
    """
    flat_out = torch.empty(sum(out_splits), dtype=flat_in.dtype, device=flat_in.device)
    if len(in_splits) == 1:
        flat_out.copy_(flat_in)
        return PendingAllToAll(None, flat_out, flat_in)
    me = group_rank(group)
    comm_stats.add("all_to_all", (sum(in_splits) - in_splits[me]) * flat_in.element_size(),
                   sum(in_splits) - in_splits[me])
    work = dist.all_to_all_single(flat_out, flat_in, out_splits, in_splits, group=group, async_op=True)
    return PendingAllToAll(work, flat_out, flat_in)


def _all_to_all_encoded(send, recv_shapes, group, codec) -> list[torch.Tensor]:
    """all_to_all_chunks with each chunk sent as codec bytes (its own chunk is never encoded)."""
    me = group_rank(group)
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


def all_gather(x: torch.Tensor, group: dist.ProcessGroup | None, kind: str = "all_gather") -> list[torch.Tensor]:
    """Every rank's x (all the same shape), in group rank order."""
    world = group_size(group)
    if world == 1:
        return [x]
    x = x.contiguous()
    parts = [torch.empty_like(x) for _ in range(world)]
    comm_stats.add(kind, x.numel() * x.element_size() * (world - 1), x.numel() * (world - 1))
    with timeline.span("all_gather"):
        dist.all_gather(parts, x, group=group)
    return parts


def all_gather_uneven(x: torch.Tensor, dim: int, lens: list[int], group: dist.ProcessGroup | None,
                      kind: str = "all_gather") -> torch.Tensor:
    """Concatenates every rank's x along dim; rank j's x has lens[j] rows on dim (other dims agree)."""
    if len(lens) == 1:
        return x
    dim = dim % x.dim()
    longest = max(lens)
    if x.shape[dim] < longest:  # all_gather needs equal shapes: pad, then trim
        pad_shape = list(x.shape)
        pad_shape[dim] = longest - x.shape[dim]
        x = torch.cat([x, x.new_zeros(pad_shape)], dim=dim)
    parts = all_gather(x, group, kind)
    return torch.cat([p.narrow(dim, 0, n) for p, n in zip(parts, lens)], dim=dim)


def all_reduce(x: torch.Tensor, group: dist.ProcessGroup | None, kind: str, op: str = "sum") -> torch.Tensor:
    """Reduces x (same shape on every rank) in place with `op` ("sum" or "max"); returns x."""
    world = group_size(group)
    if world == 1:
        return x
    comm_stats.add(kind, x.numel() * x.element_size() * 2 * (world - 1) // world)
    dist.all_reduce(x, op=_OPS[op], group=group)
    return x


def tensor_parallel_all_reduce(x: torch.Tensor, group: dist.ProcessGroup | None,
                               kind: str = "tensor_parallel_all_reduce") -> torch.Tensor:
    """Tensor parallelism's partial sums, summed in place over the tp group: a row-parallel Linear's [B, S, D]
    (kind tensor_parallel_all_reduce), an across-heads RMSNorm's sums of squares [B, S, 1] (tensor_parallel_norm).

    Counted as `kind`: 2 (ranks - 1) / ranks times the tensor's bytes, a ring all-reduce's traffic
    (docs/tensor-parallel.md gives the per-step formula)."""
    world = group_size(group)
    if world == 1:
        return x
    numel = x.numel() * 2 * (world - 1) // world
    comm_stats.add(kind, numel * x.element_size(), numel)
    with timeline.span(kind):
        dist.all_reduce(x, op=dist.ReduceOp.SUM, group=group)
    return x


def broadcast(x: torch.Tensor, src: int, group: dist.ProcessGroup | None, kind: str) -> torch.Tensor:
    """x of group rank `src` written into x on every rank (same shape everywhere); returns x."""
    world = group_size(group)
    if world == 1:
        return x
    if group_rank(group) == src:
        comm_stats.add(kind, x.numel() * x.element_size() * (world - 1), x.numel() * (world - 1))
    with timeline.span("broadcast"):
        dist.broadcast(x, dist.get_global_rank(group, src), group=group)
    return x


def broadcast_object(obj, src: int, group: dist.ProcessGroup | None, kind: str):
    """Group rank `src`'s picklable obj on every rank (what the others pass is ignored).

    For results of any structure (tuples of tensors and None, errors as text); tensors
    travel through the CPU.
    """
    world = group_size(group)
    if world == 1:
        return obj
    if group_rank(group) == src:
        comm_stats.add(kind, len(pickle.dumps(obj)) * (world - 1))
    box = [obj]
    dist.broadcast_object_list(box, dist.get_global_rank(group, src), group=group)
    return box[0]


def all_gather_object(obj, group: dist.ProcessGroup | None, kind: str) -> list:
    """Every group rank's picklable obj, in group rank order (small facts each rank decided alone, compared)."""
    world = group_size(group)
    if world == 1:
        return [obj]
    comm_stats.add(kind, len(pickle.dumps(obj)) * (world - 1))
    out = [None] * world
    dist.all_gather_object(out, obj, group=group)
    return out


def broadcast_from(x: torch.Tensor | None, src: int, group: ProcessGroup | None, kind: str, device) -> torch.Tensor:
    """Group rank `src`'s tensor on every rank, where only `src` has one (the others pass None).

    Its shape and dtype travel first (a small object), then the values; received on `device`.
    """
    if group_size(group) == 1:
        return x
    me = group_rank(group)
    shape, dtype = broadcast_object((tuple(x.shape), x.dtype) if me == src else None, src, group, kind)
    if me != src:
        x = torch.empty(shape, dtype=dtype, device=device)
    return broadcast(x.contiguous(), src, group, kind)
