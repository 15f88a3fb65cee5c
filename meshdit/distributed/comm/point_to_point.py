"""Point to point: ring exchange, pipeline stage channel, neighbour (halo) exchange, plain send/recv.

Peers are named by their index in the group, never by global rank. Every send here
either is posted together with the receive it waits on (ring, halos), or is an
isend whose completion is waited for later (pipeline): see the package docstring
for why a blocking send in a cycle deadlocks on gloo.
"""
from __future__ import annotations

import torch
import torch.distributed as dist

from .collectives import broadcast, group_rank, group_size
from ..timeline import timeline
from .stats import comm_stats


class RingExchange:
    """Sends a tensor to the next rank of a ring while receiving the previous rank's.

    The send and the receive are posted together (batch_isend_irecv) and waited for
    together; the caller computes on its current block between start() and wait().
    NOTE: every rank of the ring calls start() and wait() the same number of times.
    """

    def __init__(self, group: dist.ProcessGroup, codec=None) -> None:
        self.group = group
        self.codec = codec
        me, world = group_rank(group), group_size(group)
        self.next_rank = dist.get_global_rank(group, (me + 1) % world)
        self.prev_rank = dist.get_global_rank(group, (me - 1) % world)
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


def exchange_with_neighbours(to_prev: torch.Tensor | None, to_next: torch.Tensor | None,
                             group: dist.ProcessGroup, kind: str) -> tuple[torch.Tensor | None, torch.Tensor | None]:
    """Sends to_prev to group rank me - 1 and to_next to me + 1; returns (from me - 1, from me + 1).

    None on a side means there is no neighbour there (the first or last rank); what a
    neighbour sends has the shape of what this rank sends it.
    NOTE: every rank of the group calls this for the same tensor, in the same order.
    """
    me = group_rank(group)
    ops, received = [], [None, None]
    for side, (tensor, peer) in enumerate(((to_prev, me - 1), (to_next, me + 1))):
        if tensor is None:
            continue
        tensor = tensor.contiguous()
        received[side] = torch.empty_like(tensor)
        global_peer = dist.get_global_rank(group, peer)
        ops.append(dist.P2POp(dist.irecv, received[side], global_peer, group))
        ops.append(dist.P2POp(dist.isend, tensor, global_peer, group))
        comm_stats.add(kind, tensor.numel() * tensor.element_size())
    if ops:
        for req in dist.batch_isend_irecv(ops):
            req.wait()
    return received[0], received[1]


class PipeChannel:
    """Activations and latents between pipeline stages (group ranks of the pp group).

    Sends are isends of a private copy (or of its codec bytes): they return at once,
    and finish() waits for the ones still in flight. Receives block.
    `codec_for(tensor)` gives the wire codec for a tensor (None: sent exactly).
    """

    def __init__(self, group: dist.ProcessGroup, codec_for=None) -> None:
        self.group = group
        self.codec_for = codec_for or (lambda tensor: None)
        self._pending: list = []  # (work, buffer) of sends in flight; the buffer lives until the work completes

    def send(self, tensor: torch.Tensor, stage: int) -> None:
        codec = self.codec_for(tensor)
        buffer = codec.encode(tensor) if codec is not None else tensor.detach().contiguous().clone()
        comm_stats.add("pipe_p2p", buffer.numel() * buffer.element_size(), tensor.numel())
        dst = dist.get_global_rank(self.group, stage)
        with timeline.span("send_post", dst):
            work = dist.isend(buffer, dst, group=self.group)
        self._pending = [(w, b) for w, b in self._pending if not w.is_completed()] + [(work, buffer)]

    def recv(self, like: torch.Tensor, stage: int) -> torch.Tensor:
        """Receives a tensor of `like`'s shape and dtype from `stage`."""
        codec = self.codec_for(like)
        src = dist.get_global_rank(self.group, stage)
        if codec is None:
            buffer = torch.empty(like.shape, dtype=like.dtype, device=like.device)
            with timeline.span("recv", src):
                dist.recv(buffer, src, group=self.group)
            return buffer
        wire = torch.empty(codec.wire_bytes(like.shape), dtype=torch.uint8, device=like.device)
        with timeline.span("recv", src):
            dist.recv(wire, src, group=self.group)
        return codec.decode(wire, like.shape, like.dtype)

    def send_update(self, new: torch.Tensor, old: torch.Tensor, stage: int) -> None:
        """Hands `new` to `stage`, which holds `old` in its place.

        With a codec only the update new - old travels (its quantization error is a
        fraction of the step, not of the values), and `new` becomes exactly what the
        receiver reconstructs, so the two stages never drift apart.
        """
        codec = self.codec_for(new)
        if codec is None:
            self.send(new, stage)
            return
        update = new - old
        self.send(update, stage)
        new.copy_(old + codec.decode(codec.encode(update), update.shape, update.dtype))

    def recv_update(self, view: torch.Tensor, stage: int) -> None:
        """Receives what send_update sent into `view` (which holds the old values)."""
        received = self.recv(view, stage)
        if self.codec_for(view) is None:
            view.copy_(received)
        else:
            view.add_(received)

    def broadcast_from(self, tensor: torch.Tensor, stage: int) -> torch.Tensor:
        """NOTE: every stage joins this broadcast."""
        return broadcast(tensor, stage, self.group, "pipe_broadcast")

    def finish(self) -> None:
        """Waits for every send still in flight (each completes once its receiver has posted the receive)."""
        with timeline.span("send_wait"):
            for work, _ in self._pending:
                work.wait()
        self._pending = []


def send(tensor: torch.Tensor, dst: int, group: dist.ProcessGroup, kind: str) -> None:
    """Blocking send to group rank dst: returns once dst has posted the matching recv (gloo and NCCL).

    NOTE: only where dst is known to be receiving already, never in a cycle of sends.
    """
    comm_stats.add(kind, tensor.numel() * tensor.element_size())
    dist.send(tensor, dist.get_global_rank(group, dst), group=group)


def recv_into(tensor: torch.Tensor, src: int, group: dist.ProcessGroup) -> torch.Tensor:
    """Blocking receive from group rank src into `tensor`; returns it."""
    dist.recv(tensor, dist.get_global_rank(group, src), group=group)
    return tensor
