"""Block offload (`--offload blocks`): the transformer blocks' weights wait in host memory between uses.

Each block this rank computes (the plan's block lists, PipeFusion's stand-ins left out) keeps its parameters and
buffers in host memory (pinned when the device is a GPU). Just before a block runs, its tensors are on the device
(copied then, or already there: the block after it was prefetched while it ran, on a side stream on GPUs); after it
ran they are dropped from the device again. So at most two blocks are on the device at once: the running one and
the next (the last block prefetches the first, for the next step; it stays on the device between calls). The values are the same tensors copied, so the images are bit for bit those without offload.

What it costs: every block's weights cross the host link once per transformer call. On a GPU the copy of block
i + 1 overlaps block i's compute, so the call is as fast as without offload when a block's compute takes longer
than its copy (large images), and bound by the host link otherwise. A block the step cache skips is not run, so
the prefetch of a block that then does not run is dropped when another one arrives.

On CPU ranks the "device" is host memory too: the mechanism runs (and is tested) but saves nothing there.
"""
from __future__ import annotations

import torch
from torch import nn

from .compile import blocks_of
from .plan import StagePlan


class _Resident:
    """One block's tensors: their host copies, and whether the device copies are in place."""

    def __init__(self, block: nn.Module, device: torch.device) -> None:
        self.slots = [(module, kind, name) for module in block.modules()
                      for kind, table in (("p", module._parameters), ("b", module._buffers))
                      for name, t in table.items() if t is not None]
        pin = device.type == "cuda"
        self.host = []
        for module, kind, name in self.slots:
            t = _table(module, kind)[name].detach()
            copy = t.to("cpu", copy=True)
            self.host.append(copy.pin_memory() if pin else copy)
        self.placeholders = [torch.empty(0, dtype=h.dtype, device=device) for h in self.host]
        self.on_device = True
        self.ready = None  # the CUDA event its prefetch recorded
        self.leave()

    def bytes(self) -> int:
        return sum(h.numel() * h.element_size() for h in self.host)

    def arrive(self, device: torch.device, stream=None) -> None:
        """Copies the host tensors to the device (on `stream` when given: a prefetch)."""
        if self.on_device:
            return
        for (module, kind, name), host in zip(self.slots, self.host):
            with torch.cuda.stream(stream) if stream is not None else _nothing():
                # on CPU a copy as well: the block's tensors are fresh ones, as on a GPU
                copy = host.to(device, non_blocking=stream is not None, copy=True)
            _set(module, kind, name, copy)
        if stream is not None:
            self.ready = torch.cuda.Event()
            self.ready.record(stream)
        self.on_device = True

    def wait(self) -> None:
        """Makes the compute stream wait for a prefetch, and tells the allocator the tensors are used there."""
        if self.ready is None:
            return
        current = torch.cuda.current_stream()
        current.wait_event(self.ready)
        for module, kind, name in self.slots:
            _table(module, kind)[name].record_stream(current)
        self.ready = None

    def leave(self) -> None:
        """Drops the device copies (the host ones stay)."""
        if not self.on_device:
            return
        for (module, kind, name), empty in zip(self.slots, self.placeholders):
            _set(module, kind, name, empty)
        self.on_device = False


class _nothing:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


def _table(module: nn.Module, kind: str) -> dict:
    return module._parameters if kind == "p" else module._buffers


def _set(module: nn.Module, kind: str, name: str, tensor: torch.Tensor) -> None:
    if kind == "p":
        module._parameters[name].data = tensor
    else:
        module._buffers[name] = tensor


class BlockOffload:
    """The hooks of one transformer's offloaded blocks; remove() puts every block back on the device."""

    def __init__(self, transformer: nn.Module, plan: StagePlan, device: torch.device) -> None:
        self.device = device
        self.blocks = [b for b in blocks_of(transformer, plan) if any(True for _ in b.parameters())]
        self.resident = [_Resident(b, device) for b in self.blocks]
        self.stream = torch.cuda.Stream(device) if device.type == "cuda" else None
        self.most_on_device = 0  # the largest number of blocks on the device at once (tests check it)
        self.most_bytes_on_device = 0  # and of their bytes (benchmarks.planner_memory)
        self.handles = []
        for i, block in enumerate(self.blocks):
            self.handles.append(block.register_forward_pre_hook(lambda _m, _a, i=i: self._arrive(i)))
            self.handles.append(block.register_forward_hook(lambda _m, _a, _o, i=i: self._leave(i)))

    def _arrive(self, i: int) -> None:
        for j, r in enumerate(self.resident):  # a prefetch the step cache made useless
            if j != i and r.on_device:
                r.wait()  # (its copy may still be running)
                r.leave()
        block = self.resident[i]
        block.arrive(self.device)
        block.wait()
        following = self.resident[(i + 1) % len(self.resident)]
        if following is not block:
            following.arrive(self.device, self.stream)
        self.most_on_device = max(self.most_on_device, sum(r.on_device for r in self.resident))
        self.most_bytes_on_device = max(self.most_bytes_on_device,
                                        sum(r.bytes() for r in self.resident if r.on_device))

    def _leave(self, i: int) -> None:
        self.resident[i].leave()

    def host_bytes(self) -> int:
        return sum(r.bytes() for r in self.resident)

    def remove(self) -> None:
        for h in self.handles:
            h.remove()
        for r in self.resident:
            r.arrive(self.device)
            r.ready = None
        self.handles = []


def apply_block_offload(transformer: nn.Module, plan: StagePlan, device: torch.device) -> BlockOffload:
    """Offloads the blocks of `plan` this rank computes; the returned handle's remove() undoes it."""
    return BlockOffload(transformer, plan, device)
