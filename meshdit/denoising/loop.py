"""The engine's denoising loop: every step's transformer calls, guidance and scheduler step."""
from __future__ import annotations

import os
import signal

import torch
from tqdm.auto import tqdm

from ..parallel.cfg import BranchExchange, local_branches
from .recipe import DenoiseState, Recipe


class GenerationCancelled(Exception):
    """on_step asked to stop; every rank raises it at the same step boundary."""

    def __init__(self, step: int) -> None:
        super().__init__(f"cancelled at step {step}")
        self.step = step


def denoise(recipe: Recipe, state: DenoiseState, cfg_group=None,
            show_progress: bool = False, on_step=None) -> torch.Tensor:
    """Runs every step; returns the final latents.

    With a CFG group of d ranks, each runs its guidance branches (parallel/cfg.py: round-robin) and the noise
    predictions are exchanged, so all apply the same guidance (exact).
    NOTE: every rank of `cfg_group` joins one all_gather per step.
    """
    branches, local, _ = local_branches(state, cfg_group)
    exchange = BranchExchange(branches, cfg_group)
    latents = state.latents
    fail_at = _injected_failure()
    for i, t in enumerate(tqdm(state.timesteps, disable=not show_progress, desc="denoising", unit="step")):
        if fail_at == i:
            fail_injected(i)
        if on_step is not None and on_step(i, len(state.timesteps)):  # agreed by every rank (Engine)
            raise GenerationCancelled(i)
        noise_pred = guided_prediction(recipe, state, i, t, latents, local, exchange)
        latents = advance(recipe, state, noise_pred, t, latents)
    return latents


def guided_prediction(recipe: Recipe, state: DenoiseState, i: int, t: torch.Tensor, latents: torch.Tensor,
                      local: list[str], exchange: BranchExchange) -> torch.Tensor:
    """Step i's guided noise prediction: this rank's branches, exchanged over the cfg group, guided."""
    active = recipe.step_branches(state, i)
    mine = [b for b in local if b in active]
    preds = recipe.predict(state, latents, t, mine) if mine else {}
    if exchange.size > 1:
        preds = exchange(preds, active, latents)
    return recipe.guide(state, preds)


def advance(recipe: Recipe, state: DenoiseState, noise_pred: torch.Tensor, t: torch.Tensor,
            latents: torch.Tensor) -> torch.Tensor:
    """The next latents: the request's sampler where it set one (meshdit.rl's flow-sde), else the recipe's step."""
    if state.sampler is not None:
        return state.sampler.step(recipe.pipe.scheduler, noise_pred, t, latents)
    return recipe.step(state, noise_pred, t, latents)


def _injected_failure() -> int | None:
    """MESHDIT_FAIL_AT_STEP=RANK:STEP makes that rank raise at that step (for testing error handling);
    RANK:STEP:SIGNAL (e.g. 1:3:SIGKILL) makes it send itself that signal instead (a rank killed mid-run)."""
    spec = os.environ.get("MESHDIT_FAIL_AT_STEP")
    if not spec:
        return None
    rank, step = (int(x) for x in spec.split(":")[:2])
    return step if int(os.environ.get("RANK", "0")) == rank else None


def fail_injected(step: int) -> None:
    """What MESHDIT_FAIL_AT_STEP asks of this rank at `step`: raise, or send itself its signal."""
    parts = os.environ["MESHDIT_FAIL_AT_STEP"].split(":")
    if len(parts) > 2:
        os.kill(os.getpid(), signal.Signals[parts[2]])
        signal.pause()  # a signal this process handles (SIGTERM, SIGINT) raises here
    raise RuntimeError(f"failure injected at step {step} by MESHDIT_FAIL_AT_STEP")
