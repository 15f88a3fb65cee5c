"""How a checkpoint's tensors reach a skeleton: shared read-only file pages, or a stream from one reader rank.

shared: each CPU rank maps the files read-only (MAP_PRIVATE, never written) and its
parameters are views of the mapping, so all ranks of a host use the same page-cache
pages: one copy of the weights in host memory whatever the number of ranks.
broadcast: rank 0 alone reads, tensor by tensor in the agreed order, and sends each
to the ranks that keep it; a receiver materialises it on its device (through
`on_tensor`, e.g. an FP8 quantiser) before the next one arrives.
"""
from __future__ import annotations

from typing import Callable

import torch
import torch.distributed as dist

from ..distributed.comm import broadcast, recv_into, send
from .checkpoint import TensorEntry

OnTensor = Callable[[str, torch.Tensor], torch.Tensor]


class FileViews:
    """Zero-copy CPU tensors over read-only mappings of safetensors files."""

    def __init__(self) -> None:
        self._storages: dict[str, torch.UntypedStorage] = {}

    def tensor(self, entry: TensorEntry) -> torch.Tensor:
        storage = self._storages.get(entry.path)
        if storage is None:
            import os

            storage = torch.UntypedStorage.from_file(entry.path, shared=False, nbytes=os.path.getsize(entry.path))
            self._storages[entry.path] = storage
        size = entry.dtype.itemsize
        if entry.start % size == 0:  # safetensors aligns data, so this is the usual case
            return torch.empty(0, dtype=entry.dtype).set_(storage, entry.start // size, entry.shape)
        raw = torch.empty(0, dtype=torch.uint8).set_(storage, entry.start, (entry.nbytes,))
        return raw.clone().view(entry.dtype).reshape(entry.shape)


def shared_tensors(entries: list[TensorEntry], keep: Callable[[str], bool]):
    """(entry, CPU tensor) for each kept entry, as views of the files."""
    views = FileViews()
    for entry in entries:
        if keep(entry.name):
            yield entry, views.tensor(entry)


def streamed_tensors(entries: list[TensorEntry], keep: Callable[[str], bool], device: torch.device,
                     group=None):
    """(entry, tensor on `device`, file dtype) for each kept entry, rank 0 of `group` reading and sending.

    NOTE: every rank of the group iterates to the end: each tensor is one collective
    (or point-to-point sends to the ranks that keep it) in the same order on all ranks.
    """
    group = group or dist.group.WORLD
    ranks = list(range(dist.get_world_size(group)))  # group ranks
    me = dist.get_rank(group)
    reader = 0
    mine = [keep(e.name) for e in entries]
    needs: list = [None] * len(ranks)
    # control plane: who keeps which tensor, agreed once (a list of booleans per rank)
    dist.all_gather_object(needs, mine, group=group)
    views = FileViews() if me == reader else None
    for index, entry in enumerate(entries):
        takers = [r for r, need in zip(ranks, needs) if need[index]]
        if not takers:
            continue
        if me == reader:
            payload = views.tensor(entry).to(device).reshape(-1).view(torch.uint8)  # gloo/NCCL send bytes of any dtype
        elif me in takers:
            payload = torch.empty(entry.nbytes, dtype=torch.uint8, device=device)
        else:
            continue
        if len(takers) == len(ranks):
            broadcast(payload, reader, group, "load_broadcast")
        elif me == reader:
            for r in takers:  # each taker is already waiting in its receive
                if r != reader:
                    send(payload, r, group, "load_p2p")
        else:
            recv_into(payload, reader, group)
        if me in takers:
            yield entry, payload.view(entry.dtype).reshape(entry.shape)
