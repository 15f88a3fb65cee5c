"""Trajectory: what a flow-sde rollout recorded, enough to replay it (Engine.log_probs) or to train on it."""
from __future__ import annotations

from dataclasses import dataclass, replace

import torch


@dataclass
class Trajectory:
    """N images' SDE rollouts of T steps (N: the requests' images, in order).

    requests: the GenerateRequests as run (model defaults filled in); counts: images per request. A replay prepares
    the same requests again (text embeddings, timesteps) and reads the latents.
    """

    latents: torch.Tensor  # [N, T + 1, *latent]: x_0 (the initial noise) .. x_T (the final latents), model dtype
    noise: torch.Tensor  # [N, T, *latent] float32: eps drawn at each step
    log_probs: torch.Tensor  # [N, T] float32: log p(x_{i+1} | x_i), averaged over the latent's elements
    timesteps: torch.Tensor  # [T]: the timestep of each step
    sigmas: torch.Tensor  # [T + 1] float32: the scheduler's sigmas (the last one 0)
    noise_level: float
    requests: list
    counts: list[int]

    @property
    def num_images(self) -> int:
        return self.latents.shape[0]

    @property
    def num_steps(self) -> int:
        return self.log_probs.shape[1]

    def split(self) -> list["Trajectory"]:
        """One Trajectory per request."""
        out, start = [], 0
        for request, count in zip(self.requests, self.counts):
            stop = start + count
            out.append(replace(self, latents=self.latents[start:stop], noise=self.noise[start:stop],
                               log_probs=self.log_probs[start:stop], requests=[request], counts=[count]))
            start = stop
        return out

    @staticmethod
    def join(parts: list["Trajectory"]) -> "Trajectory":
        """Several requests' trajectories as one (same steps and noise level), e.g. to replay them as one batch."""
        first = parts[0]
        for other in parts[1:]:
            if not torch.equal(other.timesteps, first.timesteps) or other.noise_level != first.noise_level:
                raise ValueError("only trajectories with the same timesteps and noise level can be joined")
        return replace(first, latents=torch.cat([p.latents for p in parts]), noise=torch.cat([p.noise for p in parts]),
                       log_probs=torch.cat([p.log_probs for p in parts]),
                       requests=[r for p in parts for r in p.requests], counts=[c for p in parts for c in p.counts])
