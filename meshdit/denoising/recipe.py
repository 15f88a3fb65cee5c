"""The recipe interface: what a pipeline family contributes to the engine's denoising loop.

A recipe calls the pipeline's own public pieces (encode_prompt, prepare_latents,
the scheduler, the VAE) and never copies its __call__. The loop itself lives in
loop.py so that strategies (CFG parallel, PipeFusion, ...) can reorder the work.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import torch

from ..config import GenerateRequest, RequestDefaults

COND, UNCOND = "cond", "uncond"


@dataclass
class DenoiseState:
    """Everything one generation's loop needs, prepared once."""

    latents: torch.Tensor  # the family's latent layout, e.g. Flux [B, S, C], SD3 [B, C, h, w]
    timesteps: torch.Tensor  # [steps]
    branches: dict[str, dict]  # branch -> transformer kwargs fixed for the whole loop (text embeddings, ids)
    guidance_scale: float
    height: int
    width: int
    extra: dict = field(default_factory=dict)  # family-specific values
    sampler: object = None  # a step taken instead of the recipe's (meshdit.rl's FlowSdeSampler); set per rank

    @property
    def branch_names(self) -> list[str]:
        return list(self.branches)

    @property
    def batch_size(self) -> int:
        return self.latents.shape[0]


class Recipe:
    """Base: subclasses fill in prepare / model_inputs / decode_latents; the rest is shared.

    `defaults` fill what a request leaves unset (ModelInfo.request_defaults: the registry row's,
    or the bundled model's); `packed_tokens` is the registry row's `packed`; `pixel_multiple` the
    pixels per image token along each side (the row's `pixel_multiple`, the one place that rule lives).
    """

    def __init__(self, pipe, defaults: RequestDefaults, packed_tokens: bool, pixel_multiple: int) -> None:
        self.pipe = pipe
        self.defaults = defaults
        self.packed_tokens = packed_tokens
        """Latents are [B, S, C] tokens in row-major order (Flux); else [B, C, h, w] patchified by the model."""
        self.pixel_multiple = pixel_multiple

    # -- preparation -------------------------------------------------------
    def prepare(self, request: GenerateRequest, generator: torch.Generator, device: torch.device) -> DenoiseState:
        """Text embeddings, starting latents and timesteps for `request` (unset values: the model's defaults)."""
        return self.prepare_settings(self.settings(request), generator, device)

    def prepare_settings(self, r: GenerateRequest, generator: torch.Generator, device: torch.device) -> DenoiseState:
        """The family's preparation of `r`, a request with every default filled in."""
        raise NotImplementedError

    def settings(self, request) -> "ResolvedRequest":  # noqa: F821
        """The request as resolved (Engine.generate_many passes ResolvedRequests: request.resolve_request); a
        GenerateRequest given directly gets the model's defaults from the same request.fill_defaults."""
        from ..request import ResolvedRequest, fill_defaults

        return request if isinstance(request, ResolvedRequest) else fill_defaults(request, self.defaults)

    # -- one step ----------------------------------------------------------
    def model_inputs(self, state: DenoiseState, latents: torch.Tensor, t: torch.Tensor, branch: str) -> dict:
        """Keyword arguments of one transformer call for `branch` at timestep t."""
        raise NotImplementedError

    def predict(self, state: DenoiseState, latents: torch.Tensor, t: torch.Tensor,
                branches: list[str]) -> dict[str, torch.Tensor]:
        """Noise prediction per branch; branches that take batched inputs run as one call."""
        transformer = self.transformer_for(state, t)
        batched = [b for b in branches if b not in self.solo_branches] if self.batch_branches else []
        preds = {}
        if len(batched) > 1:
            merged = _cat_batch([self.model_inputs(state, latents, t, b) for b in batched], self.unbatched_keys)
            out = transformer(**merged, return_dict=False)[0]
            preds = dict(zip(batched, out.chunk(len(batched))))
        for b in branches:
            if b not in preds:
                preds[b] = transformer(**self.model_inputs(state, latents, t, b), return_dict=False)[0]
        return {b: self.postprocess_prediction(state, preds[b]) for b in branches}

    def step_branches(self, state: DenoiseState, step: int) -> list[str]:
        """The branches step number `step` runs, in the state's order (all of them, except where a family's guidance
        adds a pass on some steps only: SD3's skip-layer guidance)."""
        return state.branch_names

    def transformer_for(self, state: DenoiseState, t: torch.Tensor):
        """The denoiser that runs at timestep t (one, except for pipelines of several experts: Wan 2.2)."""
        return self.pipe.transformer

    batch_branches = False
    """Run cond and uncond as one batched call, as the diffusers pipeline does."""

    solo_branches: tuple[str, ...] = ()
    """Branches that run as a call of their own even when the others are batched (SD3's skip-layer pass: diffusers
    runs it apart, with other arguments)."""

    unbatched_keys: tuple[str, ...] = ()
    """Tensors without a batch dim, kept whole when the batch is split (e.g. Flux's [S, 3] ids)."""

    def slice_batch(self, state: DenoiseState, start: int, stop: int) -> DenoiseState:
        """The state for images start..stop-1 of the batch (data parallelism)."""
        batch = state.batch_size

        def cut(value, key=""):
            if isinstance(value, dict):
                return {k: cut(v, k) for k, v in value.items()}
            if (isinstance(value, torch.Tensor) and value.dim() > 0 and value.shape[0] == batch
                    and key not in self.unbatched_keys):
                return value[start:stop]
            return value

        return DenoiseState(cut(state.latents), state.timesteps, cut(state.branches), state.guidance_scale,
                            state.height, state.width, cut(state.extra))

    def postprocess_prediction(self, state: DenoiseState, pred: torch.Tensor) -> torch.Tensor:
        return pred

    def guide(self, state: DenoiseState, preds: dict[str, torch.Tensor]) -> torch.Tensor:
        if UNCOND not in preds:
            return preds[COND]
        return preds[UNCOND] + state.guidance_scale * (preds[COND] - preds[UNCOND])

    def step(self, state: DenoiseState, noise_pred: torch.Tensor, t: torch.Tensor,
             latents: torch.Tensor) -> torch.Tensor:
        return self.pipe.scheduler.step(noise_pred, t, latents, return_dict=False)[0]

    # -- patches (PipeFusion) -----------------------------------------------
    def token_grid(self, state: DenoiseState) -> tuple[int, int]:
        """Image tokens as (rows, columns)."""
        return state.height // self.pixel_multiple, state.width // self.pixel_multiple

    def patch_view(self, state: DenoiseState, latents: torch.Tensor, row0: int, row1: int) -> torch.Tensor:
        """The part of `latents` (or of a noise prediction) behind token rows row0..row1-1 (a view)."""
        if self.packed_tokens:
            cols = self.token_grid(state)[1]
            return latents[:, row0 * cols:row1 * cols]  # [B, S, C]: rows of tokens are runs of the sequence
        rows = latents.shape[2] // self.token_grid(state)[0]  # latent rows per token row: the patch size
        return latents[:, :, row0 * rows:row1 * rows]  # [B, C, h, w]

    # -- output ------------------------------------------------------------
    def decode_latents(self, state: DenoiseState, latents: torch.Tensor) -> torch.Tensor:
        """Final latents -> what the pipeline passes to vae.decode ([B, C, h, w])."""
        raise NotImplementedError

    def vae_decode_kwargs(self, state: DenoiseState) -> dict:
        """Keyword arguments of vae.decode besides the latents (LTX: the decoder's timestep `temb`)."""
        return {}

    def postprocess(self, decoded: torch.Tensor, output_type: str):
        """The VAE's output [B, 3, H, W] in [-1, 1] -> what the pipeline returns (np: [B, H, W, 3] in [0, 1])."""
        return self.pipe.image_processor.postprocess(decoded, output_type=output_type)


def _cat_batch(calls: list[dict], unbatched_keys: tuple[str, ...]) -> dict:
    """Concatenate per-branch kwargs along the batch dim (tensors with a batch dim only)."""
    merged = {}
    for key, first in calls[0].items():
        values = [c[key] for c in calls]
        if isinstance(first, torch.Tensor) and first.dim() > 0 and key not in unbatched_keys:
            merged[key] = torch.cat(values)
        elif isinstance(first, dict):
            merged[key] = _cat_batch(values, unbatched_keys) if first else first
        else:
            merged[key] = first
    return merged


def flow_sigmas(scheduler, steps: int):
    """The sigmas FLUX pipelines pass to retrieve_timesteps: linear from 1, or None where the scheduler
    computes its own (use_flow_sigmas)."""
    if getattr(scheduler.config, "use_flow_sigmas", False):
        return None
    return np.linspace(1.0, 1 / steps, steps)
