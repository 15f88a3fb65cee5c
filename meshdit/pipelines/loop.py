"""The engine's denoising loop: every step's transformer calls, guidance and scheduler step."""
from __future__ import annotations

import os

import torch
import torch.distributed as dist
from tqdm.auto import tqdm

from .recipe import DenoiseState, Recipe


class GenerationCancelled(Exception):
    """on_step asked to stop; every rank raises it at the same step boundary."""

    def __init__(self, step: int) -> None:
        super().__init__(f"cancelled at step {step}")
        self.step = step


def denoise(recipe: Recipe, state: DenoiseState, cfg_group: dist.ProcessGroup | None = None,
            show_progress: bool = False, on_step=None) -> torch.Tensor:
    """Runs every step; returns the final latents.

    With a CFG group of two ranks, each runs one guidance branch and the two noise
    predictions are exchanged, so both apply the same guidance (exact).
    NOTE: both ranks of `cfg_group` join one all_gather per step.
    """
    branches, local, cfg_size = local_branches(state, cfg_group)
    latents = state.latents
    fail_at = _injected_failure()
    for i, t in enumerate(tqdm(state.timesteps, disable=not show_progress, desc="denoising", unit="step")):
        if fail_at == i:
            raise RuntimeError(f"failure injected at step {i} by MESHDIT_FAIL_AT_STEP")
        if on_step is not None and on_step(i, len(state.timesteps)):  # agreed by every rank (Engine)
            raise GenerationCancelled(i)
        preds = recipe.predict(state, latents, t, local)
        if cfg_size > 1:
            preds = _exchange_branches(preds[local[0]], branches, cfg_group)
        noise_pred = recipe.guide(state, preds)
        latents = recipe.step(state, noise_pred, t, latents)
    return latents


def local_branches(state: DenoiseState, cfg_group) -> tuple[list[str], list[str], int]:
    """(all guidance branches, the ones this rank computes, the CFG group size)."""
    branches = state.branch_names
    cfg_size = dist.get_world_size(cfg_group) if cfg_group is not None else 1
    if cfg_size > 1 and len(branches) != cfg_size:
        raise RuntimeError(f"CFG parallel over {cfg_size} ranks needs {cfg_size} guidance branches, "
                           f"this generation has {branches}")
    local = [branches[dist.get_rank(cfg_group)]] if cfg_size > 1 else branches
    return branches, local, cfg_size


def _exchange_branches(pred: torch.Tensor, branches: list[str], group: dist.ProcessGroup) -> dict:
    from ..distributed.comm import comm_stats
    from ..distributed.timeline import timeline

    parts = [torch.empty_like(pred) for _ in branches]
    comm_stats.add("all_gather", pred.numel() * pred.element_size() * (len(branches) - 1))
    with timeline.span("all_gather"):
        dist.all_gather(parts, pred.contiguous(), group=group)
    return dict(zip(branches, parts))


def _injected_failure() -> int | None:
    """MESHDIT_FAIL_AT_STEP=RANK:STEP makes that rank raise at that step (for testing error handling)."""
    spec = os.environ.get("MESHDIT_FAIL_AT_STEP")
    if not spec:
        return None
    rank, step = (int(x) for x in spec.split(":"))
    return step if int(os.environ.get("RANK", "0")) == rank else None
