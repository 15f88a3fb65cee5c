"""How a checkpoint's tensors reach a skeleton: shared read-only file pages, or a stream from one reader rank.

shared: each CPU rank maps the files read-only (MAP_PRIVATE, never written) and its
parameters are views of the mapping, so all ranks of a host use the same page-cache
pages: one copy of the weights in host memory whatever the number of ranks. When the
working dtype differs from the file's (fp32 file, bf16 run), one rank per host casts
the weights into one shared memory file that every rank of the host maps instead
(shared_cast_tensors): still one copy per host, in the working dtype.
broadcast: the lowest rank of each host alone reads, tensor by tensor in the agreed
order, and sends each to the ranks of its host that keep it; a receiver materialises it on
its device (and load_model's on_loaded may turn its layer FP8) before the next one arrives.
"""
from __future__ import annotations

import os
import socket
import tempfile
from typing import Callable

import torch
import torch.distributed as dist

from ..distributed.comm import broadcast, recv_into, send
from .checkpoint import TensorEntry

class FileViews:
    """Zero-copy CPU tensors over read-only mappings of safetensors files."""

    def __init__(self) -> None:
        self._storages: dict[str, torch.UntypedStorage] = {}

    def tensor(self, entry: TensorEntry) -> torch.Tensor:
        storage = self._storages.get(entry.path)
        if storage is None:
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
    """(entry, tensor on `device`) for each kept entry, the lowest rank of `group` reading and sending.

    Call it with one group per host (host_groups): one reader per host, no weights between hosts.

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
            payload = _receive_buffer(entry, device)
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


def _receive_buffer(entry: TensorEntry, device: torch.device) -> torch.Tensor:
    """Bytes for `entry`; on the CPU at the address alignment the reader's file view has.

    CPU GEMM kernels choose their code path by the operands' address alignment, so the
    same weights 8 bytes off a cache line round differently from a 64-byte aligned copy:
    receivers match the reader's (and a plain load's) file-view alignment to stay bit-identical.
    """
    if device.type != "cpu":
        return torch.empty(entry.nbytes, dtype=torch.uint8, device=device)
    line = 64
    raw = torch.empty(entry.nbytes + line, dtype=torch.uint8)
    offset = (entry.start - raw.data_ptr()) % line
    return raw[offset:offset + entry.nbytes]


def host_id() -> str:
    """This rank's host: MESHDIT_HOST_ID when set (containers of different machines may share a hostname), else the hostname."""
    return os.environ.get("MESHDIT_HOST_ID") or socket.gethostname()


def host_groups(group=None) -> tuple[list[int], object]:
    """(ranks of `group` on this rank's host, a process group of them): one reader per host reads for it.

    NOTE: every rank of `group` joins (an object gather, and one new_group per host when there
    are several, created in the same order on all ranks).
    """
    ranks = dist.get_process_group_ranks(group) if group is not None else list(range(dist.get_world_size()))
    hosts: list = [None] * len(ranks)
    dist.all_gather_object(hosts, host_id(), group=group)
    mine = hosts[ranks.index(dist.get_rank())]
    if len(set(hosts)) == 1:
        return ranks, group
    own = None
    for host in sorted(set(hosts), key=hosts.index):  # by lowest rank: the same order everywhere
        members = [r for r, h in zip(ranks, hosts) if h == host]
        created = dist.new_group(members)
        if host == mine:
            own = (members, created)
    return own


def shared_cast_tensors(entries: list[TensorEntry], keep: Callable[[str], bool],
                        target_of: Callable[[TensorEntry], torch.dtype], group=None):
    """(entry, CPU tensor already in target_of(entry)) for each kept entry: views of one cast copy per host.

    The lowest rank of each host casts, tensor by tensor (one tensor's bytes in memory at a
    time), every entry any rank of its host keeps into a file in /dev/shm; every rank of
    the host maps that file read-only, and the file is unlinked once all have mapped it (the
    pages live as long as the mappings). Tensors sit at 64-byte aligned offsets, like the
    fresh tensors a plain load's cast makes (CPU kernels round by alignment).
    NOTE: every rank of the group joins the same collectives (two object gathers, a barrier).
    """
    from ..errors import ConfigError

    ranks = dist.get_process_group_ranks(group) if group is not None else list(range(dist.get_world_size()))
    me = dist.get_rank()
    mine = (host_id(), [keep(e.name) for e in entries])
    everyone: list = [None] * len(ranks)
    dist.all_gather_object(everyone, mine, group=group)
    host = [r for r, (name, _) in zip(ranks, everyone) if name == mine[0]]
    wanted = [any(everyone[ranks.index(r)][1][i] for r in host) for i in range(len(entries))]
    offsets, size = _layout(entries, wanted, target_of)
    outcome: object = None
    if me == host[0]:
        try:
            outcome = _write_cast_file(entries, wanted, offsets, size, target_of)
        except (OSError, RuntimeError) as exc:
            outcome = ConfigError(f"casting the weights into shared memory failed on rank {me}: {exc}")
    outcomes: list = [None] * len(ranks)
    dist.all_gather_object(outcomes, outcome, group=group)
    path = outcomes[ranks.index(host[0])]
    failed = [o for o in outcomes if isinstance(o, ConfigError)]
    if failed:
        if me == host[0] and isinstance(outcome, str):
            os.unlink(outcome)
        raise failed[0]
    storage = torch.UntypedStorage.from_file(path, shared=False, nbytes=max(size, 1))
    dist.barrier(group=group)  # every rank has mapped its host's file
    if me == host[0]:
        os.unlink(path)  # no file left behind; the mappings keep the pages
    for index, entry in enumerate(entries):
        if mine[1][index]:
            dtype = target_of(entry)
            yield entry, torch.empty(0, dtype=dtype).set_(storage, offsets[index] // dtype.itemsize, entry.shape)


def _layout(entries, wanted, target_of, align: int = 64) -> tuple[list[int], int]:
    """Byte offset of each wanted entry (cast) in the shared file, and the file's size."""
    offsets, size = [], 0
    for entry, want in zip(entries, wanted):
        offsets.append(size)
        if want:
            cast_bytes = entry.nbytes // entry.dtype.itemsize * target_of(entry).itemsize
            size += -(-cast_bytes // align) * align  # rounded up: the next tensor starts aligned
    return offsets, size


def _write_cast_file(entries, wanted, offsets, size, target_of) -> str:
    """Writes the wanted entries, cast, into a new file in /dev/shm (or the temp dir); returns its path."""
    folder = "/dev/shm" if os.path.isdir("/dev/shm") else None
    fd, path = tempfile.mkstemp(prefix="meshdit-weights-", dir=folder)
    try:
        os.ftruncate(fd, size)
        for entry, want, offset in zip(entries, wanted, offsets):
            if not want or entry.nbytes == 0:
                continue
            with open(entry.path, "rb") as source:  # read, not mapped: the source pages are not kept
                source.seek(entry.start)
                raw = bytearray(source.read(entry.nbytes))
            cast = torch.frombuffer(raw, dtype=entry.dtype).to(target_of(entry))
            os.pwrite(fd, cast.view(torch.uint8).numpy().tobytes(), offset)
    except BaseException:
        os.close(fd)
        os.unlink(path)
        raise
    os.close(fd)
    return path
