"""Peak activation bytes on CPU, without torch.cuda: count tensor allocations as they happen.

A TorchDispatchMode sees every aten op. An output whose storage is not one of the
op's inputs' storages (so not a view or an in-place result) and not already live
is a new allocation: its bytes are added to the live total, and a weakref
finalizer on the storage takes them off when the storage is freed. The peak of
the live total is the most memory the region held at once beyond what existed
before it (weights and inputs are not counted; buffers the region allocates for
communication are).
"""
from __future__ import annotations

import weakref

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves


class PeakAllocations(TorchDispatchMode):
    """with PeakAllocations() as m: ...  then m.peak_bytes."""

    def __init__(self) -> None:
        super().__init__()
        self.live_bytes = 0
        self.peak_bytes = 0
        self._live: set[int] = set()

    def _freed(self, key: int, nbytes: int) -> None:
        self._live.discard(key)
        self.live_bytes -= nbytes

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        inputs = {key for key, _, _ in map(_storage, tree_leaves((args, kwargs or {}))) if key is not None}
        for t in tree_leaves(out):
            key, nbytes, storage = _storage(t)
            if key is None or nbytes == 0 or key in inputs or key in self._live:
                continue
            self._live.add(key)
            self.live_bytes += nbytes
            self.peak_bytes = max(self.peak_bytes, self.live_bytes)
            weakref.finalize(storage, self._freed, key, nbytes)
        return out


def _storage(t):
    """(data_ptr, nbytes, storage) of a plain tensor; Nones for anything else.

    Wrapper subclasses (the functional collectives' AsyncCollectiveTensor) have no
    real storage: the plain tensor they wrap was counted when its op returned it.
    """
    if not isinstance(t, torch.Tensor):
        return None, None, None
    try:
        storage = t.untyped_storage()
        return storage.data_ptr(), storage.nbytes(), storage
    except RuntimeError:
        return None, None, None
