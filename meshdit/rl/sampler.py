"""FlowSdeSampler: the step the denoising loops take instead of the scheduler's when a request asks for
sampler="flow-sde" (denoising/loop.advance), recording the trajectory; in replay it reads the recorded one."""
from __future__ import annotations

import torch

from .sde import flow_sde_step, step_noise

FLOW_SDE = "flow-sde"
SAMPLERS = (None, FLOW_SDE)
"""GenerateRequest.sampler's values: None, the scheduler's own step; "flow-sde", Flow-GRPO's SDE step."""


class FlowSdeSampler:
    """One generation's SDE steps over this rank's images.

    sigmas: [T + 1] the scheduler's sigmas (the last one 0); seeds: [B] int64, each image's sample seed;
    replay: [B, T + 1, ...] a recorded trajectory's latents: each step returns the recorded next latents (teacher
    forcing) and records the log-prob of that transition under the current weights.
    """

    def __init__(self, sigmas: torch.Tensor, noise_level: float, seeds: torch.Tensor,
                 replay: torch.Tensor | None = None) -> None:
        self.sigmas = sigmas.detach().to("cpu", torch.float32)
        self.sigma_max = self.sigmas[1] if len(self.sigmas) > 1 else self.sigmas[0]
        self.noise_level = float(noise_level)
        self.seeds = seeds.to("cpu", torch.int64)
        self.replay = replay
        self.index = 0  # the step the next call takes (the direct replay of chosen steps sets it)
        self.latents: list[torch.Tensor] = []  # x_i before each step, [B, ...] each
        self.noise: list[torch.Tensor] = []  # eps drawn at each step, [B, ...] float32
        self.log_probs: list[torch.Tensor] = []  # [B] float32 per step
        self.final: torch.Tensor | None = None

    def step(self, scheduler, velocity: torch.Tensor, t: torch.Tensor, latents: torch.Tensor) -> torch.Tensor:
        """The next latents (in latents' dtype); the scheduler is not used (its sigmas were read at construction)."""
        i = self.index
        self.index += 1
        sigma, sigma_next = (self.sigmas[k].to(latents.device) for k in (i, i + 1))
        sigma_max = self.sigma_max.to(latents.device)
        if self.replay is not None:
            given = self.replay[:, i + 1].to(latents.device)
            prev, log_prob = flow_sde_step(latents, velocity, sigma, sigma_next, sigma_max, self.noise_level,
                                           prev_sample=given)
        else:
            noise = step_noise(self.seeds, i, latents.shape[1:], latents.device)
            prev, log_prob = flow_sde_step(latents, velocity, sigma, sigma_next, sigma_max, self.noise_level,
                                           noise=noise)
            self.latents.append(latents.detach())
            self.noise.append(noise)
        self.log_probs.append(log_prob)
        self.final = prev.detach()
        return prev

    def recorded(self) -> dict[str, torch.Tensor] | None:
        """This rank's record: latents [B, T + 1, ...], noise [B, T, ...], log_probs [B, T]; None where no step
        ran here (PipeFusion's stages before the last)."""
        if not self.log_probs:
            return None
        out = {"log_probs": torch.stack([p.detach() for p in self.log_probs], 1)}
        if self.replay is None:
            out["latents"] = torch.stack(self.latents + [self.final], 1)
            out["noise"] = torch.stack(self.noise, 1)
        return out
