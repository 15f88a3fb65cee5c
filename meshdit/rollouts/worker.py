"""RolloutWorker: the plain object a trainer drives (and a Ray actor can wrap): group rollouts, replay, weight sync.

NOTE: on a mesh of several ranks every rank makes the same calls with the same arguments (as with Engine).
"""
from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from ..config import GenerateRequest
from ..rl.trajectory import Trajectory


@dataclass
class Rollout:
    """One rollout call's N = prompts x group_size samples, prompt-major (sample p * G + k: prompt p's k-th)."""

    images: np.ndarray  # [N, H, W, 3] in [0, 1] (videos: [N, F, H, W, 3])
    trajectory: Trajectory  # latents [N, T + 1, ...], noise, log_probs [N, T], timesteps
    prompts: list[str]  # [N]
    seeds: list[int]  # [N]: sample i's seed (its initial noise and, through it, every step's SDE noise)


class RolloutWorker:
    """rollout / log_probs / update_weights over one Engine."""

    def __init__(self, engine=None, **from_pretrained) -> None:
        """engine: an Engine; without one, Engine.from_pretrained(**from_pretrained) builds it here, which is how a
        Ray actor gets its own: `ray.remote(RolloutWorker).remote(model=..., device="cpu")` (docs/rl.md)."""
        if engine is None:
            from ..engine import Engine

            engine = Engine.from_pretrained(**from_pretrained)
        self.engine = engine

    @classmethod
    def from_pretrained(cls, model: str | None = None, mesh=None, **engine_kwargs) -> "RolloutWorker":
        """Engine.from_pretrained's arguments (model None: the bundled model)."""
        from ..engine import Engine

        return cls(Engine.from_pretrained(model, mesh, **engine_kwargs))

    def rollout(self, prompts: list[str], group_size: int, seed: int = 0, noise_level: float = 0.7,
                **request_fields) -> Rollout:
        """group_size samples of each prompt, sample i seeded seed + i, as one batch (split over the data-parallel
        ranks, guidance branches over the cfg ranks). Each sample is a request of its own, so its trajectory
        depends only on its prompt, its seed and the weights. request_fields: GenerateRequest's (height, steps,
        guidance_scale, ...)."""
        prompts = list(prompts)
        samples = [(p, seed + i) for i, p in enumerate(q for q in prompts for _ in range(group_size))]
        base = GenerateRequest(sampler="flow-sde", noise_level=noise_level, return_trajectory=True, **request_fields)
        results = self.engine.generate_many([replace(base, prompt=p, seed=s) for p, s in samples])
        return Rollout(np.concatenate([r.images for r in results]),
                       Trajectory.join([r.trajectory for r in results]),
                       [p for p, _ in samples], [s for _, s in samples])

    def log_probs(self, trajectory: Trajectory, grad: bool = False, steps=None):
        """Engine.log_probs: [N, T] under the current weights."""
        return self.engine.log_probs(trajectory, grad=grad, steps=steps)

    def update_weights(self, weights, **kwargs) -> None:
        """Engine.update_weights: a state dict, a .safetensors path or an iterator of (name, tensor)."""
        self.engine.update_weights(weights, **kwargs)
