"""What the engine does for a flow-sde request: the checks, each image's sample seed, the sampler on the state."""
from __future__ import annotations

import torch

from ..errors import ConfigError
from ..denoising.recipe import DenoiseState, Recipe
from .sampler import FlowSdeSampler
from .sde import sample_seed

FLOW_SCHEDULERS = ("FlowMatchEulerDiscreteScheduler",)
"""Schedulers whose step is the flow-matching Euler step the SDE replaces (sigmas from 1 to 0, velocity output)."""


def check_sampler(requests: list, scheduler_class: str, recipe: Recipe, config) -> None:
    """ConfigError unless the requests (which share a batch: request.batch_key) can run flow-sde on this model and
    layout."""
    request = requests[0]
    if request.sampler is None:
        return
    if scheduler_class not in FLOW_SCHEDULERS:
        raise ConfigError(f"sampler={request.sampler!r} takes a flow-matching Euler scheduler ({', '.join(FLOW_SCHEDULERS)})"
                          f"; this model's is {scheduler_class or 'unknown'}: drop sampler=.")
    if type(recipe).step is not Recipe.step:
        raise ConfigError(f"sampler={request.sampler!r} replaces the scheduler's plain step, but this family's recipe "
                          f"({type(recipe).__name__}) steps with arguments of its own: drop sampler=.")
    steps = request.num_inference_steps
    if config.pipefusion_parallel_degree > 1 and request.warmup_steps < steps:
        raise ConfigError(f"sampler={request.sampler!r} under PipeFusion steps the whole image: set warmup_steps to "
                          f"the steps ({steps}), or use another layout (patches would draw each patch's noise apart).")
    if request.cache.enabled:
        raise ConfigError(f"sampler={request.sampler!r} with a step cache: the log-probs would be the cache's, not "
                          "the model's; drop the cache.")


def add_sample_seeds(state: DenoiseState, request) -> DenoiseState:
    """state.extra["sample_seeds"]: [B] int64, image j of the request's seed's SDE noise seed (sliced over dp)."""
    state.extra["sample_seeds"] = torch.tensor([sample_seed(request.seed, j) for j in range(state.batch_size)],
                                               dtype=torch.int64)
    return state


def attach_sampler(state: DenoiseState, scheduler, request, replay: torch.Tensor | None = None) -> FlowSdeSampler:
    """This rank's sampler for its share of the batch (state after data parallelism's share)."""
    state.sampler = FlowSdeSampler(scheduler.sigmas, request.noise_level, state.extra["sample_seeds"], replay)
    return state.sampler
