"""Which tensors a PipeFusion stage keeps: its own blocks and everything outside the block lists."""
from __future__ import annotations

from typing import Callable

from torch import nn


def stage_keep(transformer: nn.Module, plan, stage: int, num_stages: int) -> Callable[[str], bool]:
    """keep(name) for this stage, splitting blocks exactly as PipeFusion does (by parameter count).

    Works on a meta skeleton: parameter sizes are known without memory.
    """
    from ..parallel.pipefusion import balanced_stages, block_weight

    modules = dict(transformer.named_modules())
    blocks = [f"{spec.path}.{i}." for spec in plan.blocks for i in range(len(modules[spec.path]))]
    weights = [block_weight(modules[prefix[:-1]]) for prefix in blocks]
    sizes = balanced_stages(weights, num_stages)
    start = sum(sizes[:stage])
    others = tuple(p for i, p in enumerate(blocks) if not start <= i < start + sizes[stage])
    return lambda name: not name.startswith(others)
