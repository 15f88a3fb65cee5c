"""RolloutWorker as a Ray actor (what a trainer on Ray, e.g. verl, drives): `ray.remote(RolloutWorker)` rolls out,
replays and takes new weights in its own process, and its trajectory and log-probs equal the same worker's in this
process bit for bit (one thread on both sides)."""
from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest
import torch

ray = pytest.importorskip("ray", reason="Ray is an optional extra: pip install 'meshdit[ray]'")

from meshdit.rollouts.worker import RolloutWorker  # noqa: E402

REQUEST = dict(height=64, width=64, num_inference_steps=2)
PROMPTS = ["a red circle on a white background"]


@pytest.fixture(scope="module")
def actor():
    temp_dir = Path("/tmp") / f"ray-rl-{os.getpid()}"  # Ray's socket paths must stay short
    ray.init(num_cpus=1, include_dashboard=False, namespace="meshdit-rl-test", _temp_dir=str(temp_dir),
             log_to_driver=False)
    try:
        remote = ray.remote(RolloutWorker).options(num_cpus=1).remote(device="cpu")  # one thread (Ray's default)
        yield remote
    finally:
        ray.shutdown()
        subprocess.run(["rm", "-rf", str(temp_dir)], check=False)


def test_a_ray_actor_rolls_out_replays_and_updates_as_this_process_does(actor):
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        local = RolloutWorker.from_pretrained(None, device="cpu")
        mine = local.rollout(PROMPTS, group_size=2, seed=7, **REQUEST)
        theirs = ray.get(actor.rollout.remote(PROMPTS, group_size=2, seed=7, **REQUEST))
        assert theirs.seeds == mine.seeds == [7, 8]
        assert torch.equal(theirs.trajectory.latents, mine.trajectory.latents)
        assert torch.equal(theirs.trajectory.log_probs, mine.trajectory.log_probs)
        assert torch.equal(ray.get(actor.log_probs.remote(theirs.trajectory)), theirs.trajectory.log_probs)

        # a trainer's step: every transformer weight scaled, sent to the actor and applied here alike
        weights = {n: p.detach() * 1.01 for n, p in local.engine.pipe.transformer.named_parameters()}
        ray.get(actor.update_weights.remote(weights))
        local.update_weights(weights)
        after = local.log_probs(mine.trajectory)
        assert not torch.equal(after, mine.trajectory.log_probs)  # the new weights change the replay
        assert torch.equal(ray.get(actor.log_probs.remote(mine.trajectory)), after)
    finally:
        torch.set_num_threads(threads)
