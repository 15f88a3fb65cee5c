"""Peak activation bytes without torch.cuda: count tensor storages as ops create and free them.

A TorchDispatchMode sees every aten op. An output whose storage is not one of the
op's inputs' storages (so not a view or an in-place result) and not already live
is a new allocation: its bytes join the live total, and a weakref finalizer on the
storage takes them off when it is freed. The peak is the most memory the region
held at once beyond what existed before it (weights and inputs are not counted;
op-internal scratch is not seen).
"""
from __future__ import annotations

import weakref

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves


class PeakAllocations(TorchDispatchMode):
    """with PeakAllocations() as m: ...  then m.peak_bytes (and m.allocations)."""

    def __init__(self) -> None:
        super().__init__()
        self.live_bytes = 0
        self.peak_bytes = 0
        self.allocations = 0
        self._live: set[int] = set()

    def _freed(self, key: int, nbytes: int) -> None:
        self._live.discard(key)
        self.live_bytes -= nbytes

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        inputs = None
        for t in tree_leaves(out):
            storage = _storage(t)
            if storage is None or storage._cdata in self._live:
                continue
            if inputs is None:  # views and in-place results share an input's storage: not new
                inputs = {s._cdata for s in map(_storage, tree_leaves((args, kwargs or {}))) if s is not None}
            key, nbytes = storage._cdata, storage.nbytes()
            if key in inputs or nbytes == 0:
                continue
            self._live.add(key)
            self.live_bytes += nbytes
            self.allocations += 1
            self.peak_bytes = max(self.peak_bytes, self.live_bytes)
            weakref.finalize(storage, self._freed, key, nbytes)
        return out


def _storage(t):
    """The untyped storage of a plain tensor; None for anything else.

    Meta tensors and wrapper subclasses (the functional collectives'
    AsyncCollectiveTensor) have no real storage: the plain tensor a wrapper holds
    was counted when its op returned it.
    """
    if not isinstance(t, torch.Tensor) or t.device.type == "meta":
        return None
    try:
        return t.untyped_storage()
    except RuntimeError:
        return None
