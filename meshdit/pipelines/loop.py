"""The engine's denoising loop: prepare, step through the timesteps, decode."""
from __future__ import annotations

import os

import torch
from tqdm.auto import tqdm

from .recipe import DenoiseState, Recipe


def denoise(recipe: Recipe, state: DenoiseState, show_progress: bool = False) -> torch.Tensor:
    """Runs every step on this rank's share of the work; returns the final latents."""
    latents = state.latents
    fail_at = _injected_failure()
    for i, t in enumerate(tqdm(state.timesteps, disable=not show_progress, desc="denoising", unit="step")):
        if fail_at == i:
            raise RuntimeError(f"failure injected at step {i} by MESHDIT_FAIL_AT_STEP")
        preds = recipe.predict(state, latents, t, state.branch_names)
        noise_pred = recipe.guide(state, preds)
        latents = recipe.step(state, noise_pred, t, latents)
    return latents


def _injected_failure() -> int | None:
    """MESHDIT_FAIL_AT_STEP=RANK:STEP makes that rank raise at that step (for testing error handling)."""
    spec = os.environ.get("MESHDIT_FAIL_AT_STEP")
    if not spec:
        return None
    rank, step = (int(x) for x in spec.split(":"))
    return step if int(os.environ.get("RANK", "0")) == rank else None
