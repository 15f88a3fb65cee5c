"""Joining several requests' prepared states into one batch (serving), so one loop runs them all.

Each request is prepared alone (its own seed, its own text encoding), so image i of
the batch starts from exactly the noise and embeddings it would get alone.
"""
from __future__ import annotations

import torch

from .recipe import DenoiseState, Recipe


def concat_states(recipe: Recipe, states: list[DenoiseState]) -> DenoiseState:
    """States of requests that may share a batch (equal request.batch_key: the one place that decides) -> one state,
    batch dims concatenated in order; states that still cannot be joined raise ValueError."""
    if len(states) == 1:
        return states[0]
    first = states[0]
    for other in states[1:]:
        if other.latents.shape[1:] != first.latents.shape[1:] or not torch.equal(other.timesteps, first.timesteps) \
                or other.branch_names != first.branch_names:
            raise ValueError("these requests' latents, timesteps or guidance branches differ: they cannot share a "
                             "batch (request.batch_key)")

    def join(values: list, key: str = ""):
        head = values[0]
        if isinstance(head, dict):
            return {k: join([v[k] for v in values], k) for k in head}
        if (isinstance(head, torch.Tensor) and head.dim() > 0 and key not in recipe.unbatched_keys
                and all(v.shape[0] == s.batch_size for v, s in zip(values, states))):
            return torch.cat(values)
        if not isinstance(head, torch.Tensor) and any(v is not head and v != head for v in values[1:]):
            # e.g. a scheduler's per-request generator: one value cannot stand for all of them
            raise ValueError(f"requests differ in {key!r} ({type(head).__name__}), which has no batch dimension: "
                             "they cannot share a batch; run them one at a time")
        return head

    return DenoiseState(join([s.latents for s in states]), first.timesteps, join([s.branches for s in states]),
                        first.guidance_scale, first.height, first.width, join([s.extra for s in states]))
