"""RL rollouts on the bundled model: `python -m benchmarks.rl_rollouts [--prompts 4] [--group 8] [--size 128]
[--steps 8]`.

Two gloo ranks (one thread each) run a flow-sde group rollout (RolloutWorker.rollout: prompts x group samples, each
its own seed) as data parallel 2 and as Ulysses 2, after one warm-up rollout; then each replays its trajectory
(Engine.log_probs, teacher forcing, no VAE decode). Prints rollouts per second, the replay's seconds over the
rollout's, and checks that each replay equals its rollout bit for bit and that the two layouts' log-probs agree within
tests/rl's bound. The README's "RL rollouts" section quotes it (measured only on a quiet machine).
"""
from __future__ import annotations

import argparse
import time

PROMPTS = ("a red circle on a white background", "a blue square on a white background",
           "two green triangles on a white background", "a yellow star on a black background")
LAYOUTS = {"data parallel 2": dict(data_parallel_degree=2), "Ulysses 2": dict(ulysses_degree=2)}


def measure(degrees: dict, prompts: list[str], group: int, size: int, steps: int) -> dict:
    """One rank's part: (rollout s, replay s, replay == rollout, log-probs) of one group rollout on `degrees`."""
    import torch

    from meshdit.config import ParallelConfig
    from meshdit.rollouts.worker import RolloutWorker
    from meshdit.testing.rank_pool import mesh_for

    worker = RolloutWorker.from_pretrained(None, mesh_for(ParallelConfig(**degrees)), torch_dtype=torch.float32)
    try:
        request = dict(height=size, width=size, num_inference_steps=steps)
        worker.rollout(prompts[:1], 2, seed=99, **request)  # warm-up
        start = time.perf_counter()
        rollout = worker.rollout(prompts, group, seed=0, **request)
        rolled = time.perf_counter() - start
        start = time.perf_counter()
        replayed = worker.log_probs(rollout.trajectory)
        replay = time.perf_counter() - start
    finally:
        worker.engine.close()
    log_probs = rollout.trajectory.log_probs.cpu()
    return dict(rollout_s=rolled, replay_s=replay, replay_equal=torch.equal(replayed.cpu(), log_probs),
                log_probs=log_probs)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.rl_rollouts", description=__doc__.split("\n")[0])
    parser.add_argument("--prompts", type=int, default=4, help=f"prompts, at most {len(PROMPTS)} (default: 4)")
    parser.add_argument("--group", type=int, default=8, help="samples per prompt (default: 8)")
    parser.add_argument("--size", type=int, default=128, help="image side in pixels (default: 128)")
    parser.add_argument("--steps", type=int, default=8, help="denoising steps (default: 8)")
    args = parser.parse_args(argv)
    from meshdit.testing.rank_pool import close_all_pools, get_pool

    prompts = list(PROMPTS[:args.prompts])
    samples = len(prompts) * args.group
    print(f"bundled model, {len(prompts)} prompts x {args.group} samples = {samples} rollouts, {args.size} px, "
          f"{args.steps} flow-sde steps, 2 gloo ranks of one thread each")
    results = {}
    try:
        for name, degrees in LAYOUTS.items():
            ranks = get_pool(2).run(measure, degrees, prompts, args.group, args.size, args.steps, timeout=3600)
            results[name] = r = max(ranks, key=lambda x: x["rollout_s"])  # the slower rank's clock
            equal = all(x["replay_equal"] for x in ranks)
            print(f"{name:>16}: {samples / r['rollout_s']:.2f} rollouts/s ({r['rollout_s']:.1f} s), replay "
                  f"{r['replay_s']:.1f} s = {r['replay_s'] / r['rollout_s']:.2f} x the rollout, replay == rollout bit "
                  f"for bit: {equal}")
    finally:
        close_all_pools()
    a, b = (results[n]["log_probs"] for n in LAYOUTS)
    print(f"log-probs, data parallel vs Ulysses: max |diff| {float((a - b).abs().max()):.2e}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
