"""CFG parallel at the transformer's input: a pipeline that batches its guidance branches (`[latents] * 2`) gives
the transformer a batch of 2B; each cfg rank runs its slice of that batch and the slices are gathered after.

Every rank runs the same `__call__`, so every rank holds the whole batch: the pre-hook keeps this rank's rows of
each batched input (a tensor whose first dim is the batch, at the top level or inside a dict argument such as
PixArt's `added_cond_kwargs`), the forward hook all-gathers the output rows. Tuples and lists (rotary tables) are
not batched and stay whole, except a ControlNet's per-block residuals (RESIDUAL_LISTS: lists of [2B, S, D]). The rows are independent in a DiT (no op mixes samples), so any split of any batch is
exact: an odd batch splits unevenly, a batch smaller than the cfg ranks runs whole on every rank.
"""
from __future__ import annotations

import inspect

import torch

from ..distributed.comm import all_gather_uneven, group_rank, group_size, split_sizes

RESIDUAL_LISTS = ("controlnet_block_samples", "controlnet_single_block_samples", "block_controlnet_hidden_states")
"""Transformer arguments that hold a ControlNet's residuals, one batched tensor per block (the ControlNet runs whole
on every rank, over the whole guidance batch): each tensor's rows are split like the hidden states'."""


class BatchSplit:
    """Hooks on one transformer: its batch split over `group` (the cfg ranks)."""

    def __init__(self, transformer: torch.nn.Module, group) -> None:
        self.group, self.ranks, self.rank = group, group_size(group), group_rank(group)
        self.signature = inspect.signature(transformer.forward)
        self.lens: list[int] | None = None  # this call's rows per rank (None: the call ran whole)
        # prepend: before the sequence hooks' splits (which read the batch this rank keeps)
        self.handles = [transformer.register_forward_pre_hook(self._split, with_kwargs=True, prepend=True),
                        transformer.register_forward_hook(self._gather)]

    def _split(self, _module, args, kwargs):
        named = dict(self.signature.bind_partial(*args, **kwargs).arguments)
        hidden = named.get("hidden_states")
        batch = hidden.shape[0] if isinstance(hidden, torch.Tensor) else 0
        if batch < self.ranks:
            self.lens = None
            return None
        self.lens = split_sizes(batch, self.ranks)
        start, size = sum(self.lens[:self.rank]), self.lens[self.rank]

        def rows(value):
            if isinstance(value, torch.Tensor) and value.dim() >= 1 and value.shape[0] == batch:
                return value.narrow(0, start, size)
            if isinstance(value, dict):
                return {k: rows(v) for k, v in value.items()}
            return value

        return (), {name: type(value)(rows(v) for v in value) if name in RESIDUAL_LISTS and value is not None
                    else rows(value) for name, value in named.items()}

    def _gather(self, _module, _args, out):
        if self.lens is None:
            return None
        size = self.lens[self.rank]

        def whole(value):
            if isinstance(value, torch.Tensor) and value.dim() >= 1 and value.shape[0] == size:
                return all_gather_uneven(value.contiguous(), 0, self.lens, self.group, "cfg_batch_all_gather")
            return value

        if isinstance(out, tuple):
            return tuple(whole(v) for v in out)
        if isinstance(out, torch.Tensor):
            return whole(out)
        for key in list(out.keys()):  # a diffusers ModelOutput
            out[key] = whole(out[key])
        return out

    def remove(self) -> None:
        for handle in self.handles:
            handle.remove()
        self.handles = []
