"""Flow-GRPO's SDE form of the flow-matching Euler step (arXiv 2505.05470), with each image's transition log-prob.

The arithmetic follows flow_grpo's `sde_step_with_logprob` (its "sde" type): with sigma the current noise level
and dt = sigma_next - sigma (< 0),

    std  = sqrt(sigma / (1 - sigma)) * noise_level          (sigma == 1: sigma_max = sigmas[1] in the denominator)
    mean = x * (1 + std^2 / (2 sigma) * dt) + v * (1 + std^2 (1 - sigma) / (2 sigma)) * dt
    x'   = mean + std * sqrt(-dt) * eps,  eps ~ N(0, I)
    log p(x' | x) = mean over all but the batch dim of the Gaussian log-density of x' around mean.

Two choices of meshdit's, both for exactness: the noise of image b at step i is drawn on the CPU from a generator of
its own (seeded from the image's sample seed and i: `step_noise`), so it depends neither on the batch nor on the
layout; and the log-prob is taken of x' as the loop carries it on (in the latents' dtype), so a replay that reads the
recorded x' computes the very same numbers. Each image's mean runs alone (a per-row reduction), so a batch changes
nothing. Everything runs in float32, as flow_grpo does (bf16 overflows in the mean).
"""
from __future__ import annotations

import math

import torch

_MASK64 = 2**64 - 1
LOG_SQRT_2PI = math.log(math.sqrt(2 * math.pi))


def _splitmix64(x: int) -> int:
    """One splitmix64 output for the 64-bit input x: a cheap, well-mixed seed from a pair of integers."""
    x = (x + 0x9E3779B97F4A7C15) & _MASK64
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & _MASK64
    return x ^ (x >> 31)


def sample_seed(request_seed: int, image: int) -> int:
    """The SDE noise seed of image `image` (its index in the request's batch) of a request seeded `request_seed`:
    63 bits, so that an int64 tensor holds it (the state's `sample_seeds`, sliced over data-parallel ranks)."""
    return _splitmix64(_splitmix64(request_seed) ^ image) >> 1


def step_noise(seeds: torch.Tensor, step: int, shape, device) -> torch.Tensor:
    """eps [B, *shape] float32: image b's noise at step `step`, from a CPU generator seeded by (seeds[b], step)."""
    rows = []
    for seed in seeds.tolist():  # seeds: [B] int64
        generator = torch.Generator("cpu").manual_seed(_splitmix64(seed ^ _splitmix64(step + 1)))
        rows.append(torch.randn(tuple(shape), generator=generator, dtype=torch.float32))
    return torch.stack(rows).to(device)


def flow_sde_step(sample: torch.Tensor, velocity: torch.Tensor, sigma: torch.Tensor, sigma_next: torch.Tensor,
                  sigma_max: torch.Tensor, noise_level: float, noise: torch.Tensor | None = None,
                  prev_sample: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """(x' in sample's dtype, log_prob [B] float32) for one step from `sample` x with predicted velocity v.

    Either `noise` eps (rollout: x' drawn) or `prev_sample` x' (replay: x' given) is passed. sigma, sigma_next,
    sigma_max: 0-dim float32 tensors of the scheduler's sigmas.
    """
    x, v = sample.float(), velocity.float()
    dt = sigma_next - sigma
    std = torch.sqrt(sigma / (1 - torch.where(sigma == 1, sigma_max, sigma))) * noise_level
    mean = x * (1 + std ** 2 / (2 * sigma) * dt) + v * (1 + std ** 2 * (1 - sigma) / (2 * sigma)) * dt
    scale = std * torch.sqrt(-dt)
    if prev_sample is None:
        prev_sample = (mean + scale * noise).to(sample.dtype)  # what the loop carries on, as the scheduler's step
    density = -((prev_sample.detach().float() - mean) ** 2) / (2 * scale ** 2) - torch.log(scale) - LOG_SQRT_2PI
    log_prob = torch.stack([row.mean() for row in density])  # [B]: each image alone, whatever the batch
    return prev_sample, log_prob
