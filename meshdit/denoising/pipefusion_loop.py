"""The denoising loop under PipeFusion: patches stream through the stages, across steps.

Every rank runs the same sequence of transformer forwards (one per patch and
guidance branch); the stage hooks move activations between ranks. The last
stage applies guidance, steps the patch's own scheduler and hands the stepped
patch straight back to stage 0 for the next step, so the pipeline fills once per
image, not once per step. The first `warmup_steps` steps run on the whole image.
"""
from __future__ import annotations

import copy

import torch
from tqdm.auto import tqdm

from ..distributed.comm import split_sizes
from ..parallel.cfg import BranchExchange, local_branches
from .loop import GenerationCancelled, _injected_failure, advance, fail_injected
from .recipe import DenoiseState, Recipe


def pipefusion_denoise(recipe: Recipe, state: DenoiseState, pipefusion, sequence_state,
                       cfg_group, warmup_steps: int, num_patches: int,
                       show_progress: bool = False, on_step=None, kv_drift_correction: bool = True) -> torch.Tensor:
    """Returns the final latents on every stage. kv_drift_correction: see StaleKV.drift_correction.

    NOTE: every rank of the pp axis runs this with the same state; the last stages
    of a CFG pair join one all_gather per patch; all stages join the final broadcast.
    """
    pipefusion.stale_kv.reset()
    pipefusion.stale_kv.drift_correction = kv_drift_correction
    try:
        return _patch_pipeline(recipe, state, pipefusion, sequence_state, cfg_group, warmup_steps, num_patches,
                               show_progress, on_step)
    finally:  # the stale K/V belong to this generation: freed before the VAE decodes, and on an error
        pipefusion.stale_kv.reset()


def _patch_pipeline(recipe: Recipe, state: DenoiseState, pf, sequence_state, cfg_group, warmup_steps: int,
                    num_patches: int, show_progress: bool, on_step) -> torch.Tensor:
    branches, local, cfg_size = local_branches(state, cfg_group)
    exchange = BranchExchange(branches, cfg_group)
    rows, cols = recipe.token_grid(state)
    sizes = split_sizes(rows, num_patches)
    patches = [(sum(sizes[:p]), sum(sizes[:p + 1])) for p in range(num_patches)]
    whole = [(0, rows)]
    sequence_state.patch_windows = tuple((row0 * cols, row1 * cols) for row0, row1 in patches)  # in tokens
    steps = len(state.timesteps)

    def items(step: int) -> list[tuple[int, int]]:
        return whole if step < warmup_steps else patches

    latents = state.latents.clone()
    main_scheduler = recipe.pipe.scheduler
    patch_schedulers = None
    fail_at = _injected_failure()
    cancelled_at = None
    for i, t in enumerate(tqdm(state.timesteps, disable=not show_progress, desc="denoising", unit="step")):
        if fail_at == i:
            fail_injected(i)
        if on_step is not None and on_step(i, steps):  # agreed by every rank (Engine)
            if pf.is_first and i > 0 and pf.num_stages > 1:  # take the patches the last stage already sent
                for row0, row1 in items(i):
                    shape = recipe.patch_view(state, latents, row0, row1).shape
                    pf.channel.recv(torch.empty(shape, dtype=latents.dtype, device=latents.device),
                                    pf.num_stages - 1)
            cancelled_at = i
            break
        # whole-image K/V are kept only for the patch step after the last warmup step
        pf.stale_kv.keep = i + 1 == warmup_steps < steps or i >= warmup_steps
        if i == warmup_steps:  # from here on each patch steps its own copy of the scheduler
            patch_schedulers = [_patch_scheduler(main_scheduler, lambda x, p=p: recipe.patch_view(state, x, *p),
                                                 latents.shape) for p in patches]
        for p, (row0, row1) in enumerate(items(i)):
            view = recipe.patch_view(state, latents, row0, row1)
            if pf.is_first and i > 0 and pf.num_stages > 1:
                pf.channel.recv_update(view, pf.num_stages - 1)
            preds = {}
            # the last patch's window runs to the image stream's end: tokens after the grid (FLUX.1 Kontext's
            # reference image) are computed with it
            with sequence_state.patch_window(row0 * cols, row1 * cols if row1 < rows else None):
                for branch in [b for b in local if b in recipe.step_branches(state, i)]:
                    with pf.stale_kv.for_branch(branch):
                        preds.update(recipe.predict(state, latents, t, [branch]))
            if not pf.is_last:
                continue
            if cfg_size > 1:
                preds = exchange(preds, recipe.step_branches(state, i), latents)
            noise_pred = recipe.guide(state, preds)
            # the hand-back goes in the pieces stage 0 will read next step; stage 0 holds their old values
            pieces = []
            if pf.num_stages > 1 and i + 1 < steps:
                pieces = items(i + 1) if i < warmup_steps else [(row0, row1)]
            before = [recipe.patch_view(state, latents, q0, q1).clone() for q0, q1 in pieces]
            if i < warmup_steps:
                latents = advance(recipe, state, noise_pred, t, latents)
            else:
                recipe.pipe.scheduler = patch_schedulers[p]
                try:
                    stepped = recipe.step(state, recipe.patch_view(state, noise_pred, row0, row1), t,
                                          view.clone())
                finally:
                    recipe.pipe.scheduler = main_scheduler
                view.copy_(stepped)
            for (q0, q1), old in zip(pieces, before):
                pf.channel.send_update(recipe.patch_view(state, latents, q0, q1), old, 0)
    pf.channel.finish()
    if cancelled_at is not None:
        raise GenerationCancelled(cancelled_at)
    if pf.num_stages > 1:
        latents = pf.channel.broadcast_from(latents.contiguous(), pf.num_stages - 1)
    return latents


def _patch_scheduler(scheduler, view, full_shape):
    """A copy of the scheduler whose latent-shaped history (e.g. DPM-Solver's model_outputs) covers one patch."""
    patch = copy.deepcopy(scheduler)

    def cut(value):
        if isinstance(value, torch.Tensor) and value.shape == full_shape:
            return view(value).clone()
        if isinstance(value, list):
            return [cut(v) for v in value]
        return value

    for name, value in vars(patch).items():
        setattr(patch, name, cut(value))
    return patch
