"""flow-sde rollouts (meshdit/rl, docs/rl.md): every layout's trajectory and log-probs equal serial's, a sample's
trajectory is its own whatever the batch, and the replay equals the rollout bit for bit on one process.

Measured bounds against serial (FLUX.1, SD3.5, Wan tiny, 3 steps): latents differ by at most 4.6e-6 (cfg, PipeFusion
with full warmup and Ulysses often 0), log-probs by 1.8e-7; the noise drawn is equal bit for bit everywhere.
"""
import math

import pytest
import torch

from meshdit.config import ParallelConfig
from meshdit.errors import ConfigError
from tests.rl import rl_jobs

LATENT_BOUND = 2e-5  # absolute, in latent units (latents of size ~1): 4x the largest difference measured
LOG_PROB_BOUND = 1e-6  # absolute, in nats per element: 5x the largest measured

FAMILIES = ["flux", "sd35", "wan"]
LAYOUTS = {
    "ulysses2": dict(ulysses_degree=2),
    "ring2": dict(ring_degree=2),
    "cfg2": dict(cfg_degree=2),
    "dp2": dict(data_parallel_degree=2),
    "pipefusion2-full-warmup": dict(pipefusion_parallel_degree=2, warmup_steps=rl_jobs.STEPS),
}
SAMPLES = [("a red cat", 5), ("a blue dog", 6)]
_SERIAL: dict = {}


def serial(name, samples=tuple(SAMPLES)):
    if (name, samples) not in _SERIAL:
        _SERIAL[name, samples] = rl_jobs.rollout(name, {}, list(samples))
    return _SERIAL[name, samples]


def assert_same_trajectory(got, ref, where=""):
    latents, noise, log_probs = got[:3]
    assert latents.shape == ref[0].shape and log_probs.shape == ref[2].shape, where
    assert torch.equal(noise, ref[1]), f"{where}: the noise drawn differs"
    assert (latents - ref[0]).abs().max() <= LATENT_BOUND, f"{where}: latents differ"
    assert (log_probs - ref[2]).abs().max() <= LOG_PROB_BOUND, f"{where}: log-probs differ"


@pytest.mark.parametrize("name", FAMILIES)
@pytest.mark.parametrize("layout", LAYOUTS)
def test_every_layout_returns_the_serial_trajectory_and_replays_its_own_bit_for_bit(run_ranks, name, layout):
    degrees = LAYOUTS[layout]
    for rank, got in enumerate(run_ranks(ParallelConfig(**{k: v for k, v in degrees.items() if k != "warmup_steps"})
                                         .world_size, rl_jobs.rollout, name, degrees, SAMPLES)):
        assert_same_trajectory(got, serial(name), f"{name} {layout} rank {rank}")
        assert torch.equal(got[3], got[2]), f"{name} {layout} rank {rank}: the replay differs from the rollout"


@pytest.mark.parametrize("name", FAMILIES)
def test_a_sample_alone_equals_the_same_sample_in_a_batch_on_another_layout(run_ranks, name):
    alone = rl_jobs.rollout(name, {}, [("a blue dog", 6)], replay=False)
    batch = [("a red cat", 5), ("a blue dog", 6), ("a green circle", 7)]
    for got in run_ranks(2, rl_jobs.rollout, name, dict(data_parallel_degree=2), batch, replay=False):
        assert_same_trajectory([t[1:2] for t in got[:3]], alone, f"{name}: sample 1 of a batch over dp 2")


@pytest.mark.parametrize("name", FAMILIES)
def test_replay_equals_the_rollout_bit_for_bit_on_one_process_with_and_without_autograd(name):
    engine, _ = rl_jobs.engine_for(name, {})
    try:
        results = engine.generate_many([rl_jobs.rl_request(name, p, s) for p, s in SAMPLES])
        trajectories = [r.trajectory for r in results]
        rolled = torch.cat([t.log_probs for t in trajectories])  # [N, T]
        assert torch.equal(engine.log_probs(trajectories), rolled)
        with_grad = engine.log_probs(trajectories, grad=True)
        assert with_grad.requires_grad and torch.equal(with_grad.detach(), rolled)
        with_grad.sum().backward()  # a trainer's backward reaches the transformer's weights
        assert any(p.grad is not None and p.grad.abs().sum() > 0 for p in engine.pipe.transformer.parameters())
        engine.pipe.transformer.zero_grad(set_to_none=True)
        one_step = engine.log_probs(trajectories, grad=True, steps=[1])
        assert torch.equal(one_step.detach()[:, 0], rolled[:, 1])
    finally:
        engine.close()


def test_the_sde_step_is_flow_grpos_and_tends_to_the_euler_step():
    """x' = mean + scale * eps, so the log-prob of the drawn x' is -mean(eps^2)/2 - log(scale) - log(sqrt(2 pi));
    as noise_level -> 0 the mean is diffusers' Euler step x + v dt."""
    from meshdit.rl.sde import flow_sde_step

    gen = torch.Generator().manual_seed(0)
    x, v, eps = (torch.randn(2, 3, 8, generator=gen) for _ in range(3))
    sigma, sigma_next, sigma_max = torch.tensor(0.6), torch.tensor(0.4), torch.tensor(0.9)
    prev, log_prob = flow_sde_step(x, v, sigma, sigma_next, sigma_max, 0.7, noise=eps)
    std = math.sqrt(0.6 / 0.4) * 0.7
    scale = std * math.sqrt(0.2)
    mean = x * (1 + std ** 2 / 1.2 * -0.2) + v * (1 + std ** 2 * 0.4 / 1.2) * -0.2
    torch.testing.assert_close(prev, mean + scale * eps)
    torch.testing.assert_close(log_prob, -(eps ** 2).mean((1, 2)) / 2 - math.log(scale) - math.log(math.sqrt(2 * math.pi)))
    euler, _ = flow_sde_step(x, v, sigma, sigma_next, sigma_max, 1e-6, noise=torch.zeros_like(x))
    torch.testing.assert_close(euler, x + v * -0.2, atol=1e-6, rtol=0)


def test_flow_sde_refusals_say_what_to_change():
    from dataclasses import replace

    from meshdit.config import GenerateRequest
    from meshdit.engine import Engine
    from tests.parallel.sp_jobs import pipeline, request

    with pytest.raises(ConfigError, match="return_trajectory"):
        GenerateRequest(return_trajectory=True).validate()
    with pytest.raises(ConfigError, match="noise_level"):
        GenerateRequest(sampler="flow-sde", noise_level=0).validate()
    with pytest.raises(ConfigError, match="sampler must be one of"):
        GenerateRequest(sampler="sde").validate()
    pixart = Engine(pipeline("pixart-sigma"))
    try:  # DPM-Solver is no flow-matching Euler scheduler
        with pytest.raises(ConfigError, match="flow-matching Euler scheduler.*DPMSolverMultistepScheduler: drop sampler"):
            pixart.generate(replace(request("pixart-sigma", 16, 16), sampler="flow-sde"))
    finally:
        pixart.close()
    from meshdit.rl.rollout import check_sampler

    engine, _ = rl_jobs.engine_for("flux", {})
    try:
        one = rl_jobs.rl_request("flux", "a red cat", 1)
        with pytest.raises(ConfigError, match="must share sampler"):
            engine.generate_many([one, replace(one, noise_level=0.5)])
        with pytest.raises(ConfigError, match="warmup_steps to the steps"):
            check_sampler([one], "FlowMatchEulerDiscreteScheduler", engine.recipe,
                          ParallelConfig(pipefusion_parallel_degree=2))
    finally:
        engine.close()


@pytest.mark.parametrize("layout", ["dp2", "cfg2"])
def test_a_group_rollout_spreads_over_the_ranks_and_each_sample_is_its_own(run_ranks, layout):
    prompts = ["a red cat", "a blue dog"]
    serial_group = rl_jobs.group_rollout("flux", {}, prompts, 2, 10)
    assert serial_group[3] == ["a red cat", "a red cat", "a blue dog", "a blue dog"]
    assert serial_group[4] == [10, 11, 12, 13]
    for got in run_ranks(2, rl_jobs.group_rollout, "flux", LAYOUTS[layout], prompts, 2, 10):
        assert_same_trajectory(got, serial_group, f"group rollout on {layout}")
    alone = rl_jobs.rollout("flux", {}, [("a blue dog", 13)], replay=False)  # sample 3, run by itself
    assert_same_trajectory([t[3:4] for t in serial_group[:3]], alone, "sample 3 alone")
