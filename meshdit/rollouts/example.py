"""A few GRPO steps on meshdit's bundled model, on the CPU: the trainer's view of meshdit's RL rollouts (docs/rl.md).

    python -m meshdit.rollouts.example --iterations 4

Each iteration: a RolloutWorker draws `group` flow-sde samples of each prompt; the reward is how much of each image
is the colour its prompt asks for; a trainer (its own Engine on its own copy of the model, as a separate trainer
process would hold one) replays the trajectory with autograd, checks that its log-probs equal the rollout's bit for
bit, takes one GRPO step (group-normalised advantages, clipped ratio) and pushes the new weights to the worker with
update_weights. Few steps at a small size: it shows the machinery and that the reward moves, not a trained model.
"""
from __future__ import annotations

import argparse
import copy
import sys
import time

import numpy as np
import torch

PROMPTS = ("a red circle on a white background", "a blue square on a white background")
COLOURS = {"red": (1.0, 0.0, 0.0), "green": (0.0, 1.0, 0.0), "blue": (0.0, 0.0, 1.0)}
PALETTE = {**COLOURS, "white": (1.0, 1.0, 1.0), "black": (0.0, 0.0, 0.0)}


def colour_reward(images: np.ndarray, prompts: list[str]) -> np.ndarray:
    """[N]: the share of each image's pixels whose nearest palette colour is the one its prompt names.
    images: [N, H, W, 3] in [0, 1]."""
    names = list(PALETTE)
    palette = np.array([PALETTE[n] for n in names])  # [P, 3]
    nearest = np.argmin(((images[..., None, :] - palette) ** 2).sum(-1), axis=-1)  # [N, H, W]
    wanted = [names.index(next(c for c in COLOURS if c in p.split())) for p in prompts]
    return np.array([(nearest[i] == w).mean() for i, w in enumerate(wanted)])


def group_advantages(rewards: np.ndarray, group: int) -> torch.Tensor:
    """[N] float32: each reward against its prompt's group (mean 0, std 1 where the group's rewards differ)."""
    r = torch.tensor(rewards, dtype=torch.float32).view(-1, group)  # [prompts, group]
    return ((r - r.mean(1, keepdim=True)) / (r.std(1, keepdim=True) + 1e-4)).view(-1)


def grpo(iterations: int = 4, group: int = 4, steps: int = 8, size: int = 128, train_steps: int = 2,
         lr: float = 1e-4, clip: float = 1e-3, seed: int = 0, log=print) -> list[dict]:
    """Runs the loop; returns one dict per iteration (reward, replay_equal, loss, grad_norm, seconds).
    (The loss is 0 at every iteration's first replay: the ratio is exactly 1 and the advantages sum to 0; its
    gradient is not.)"""
    from ..engine import Engine
    from .worker import RolloutWorker

    worker = RolloutWorker.from_pretrained(None, device="cpu")  # on a mesh: RolloutWorker(Engine on the mesh)
    trainer = Engine(copy.deepcopy(worker.engine.pipe))  # the trainer's own copy of the model
    model = trainer.pipe.transformer.requires_grad_(True)
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.0)
    pick = np.random.default_rng(seed)
    history = []
    for it in range(iterations):
        start = time.perf_counter()
        rollout = worker.rollout(PROMPTS, group, seed=seed + 1000 * it, height=size, width=size,
                                 num_inference_steps=steps)
        rewards = colour_reward(rollout.images, rollout.prompts)
        advantages = group_advantages(rewards, group)  # [N]
        old = rollout.trajectory.log_probs  # [N, T]
        equal, total = True, 0.0
        for j in sorted(pick.choice(steps, size=min(train_steps, steps), replace=False).tolist()):
            new = trainer.log_probs(rollout.trajectory, grad=True, steps=[j])[:, 0]  # [N], with autograd
            equal &= torch.equal(new.detach(), old[:, j])  # the trainer's weights are the worker's: 0-diff
            ratio = torch.exp(new - old[:, j])
            loss = -torch.minimum(ratio * advantages, ratio.clamp(1 - clip, 1 + clip) * advantages).mean()
            (loss / train_steps).backward()
            total += loss.item() / train_steps
        grad_norm = float(torch.nn.utils.clip_grad_norm_(model.parameters(), float("inf")))
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        worker.update_weights(model.state_dict())  # weight sync, no restart
        history.append(dict(reward=float(rewards.mean()), replay_equal=equal, loss=total, grad_norm=grad_norm,
                            seconds=time.perf_counter() - start))
        log(f"iteration {it}: mean reward {rewards.mean():.4f} (per prompt "
            f"{', '.join(f'{x:.3f}' for x in rewards.reshape(-1, group).mean(1))}), replay == rollout bit for bit: "
            f"{equal}, gradient norm {grad_norm:.3g}, {history[-1]['seconds']:.1f} s")
    worker.engine.close()
    trainer.close()
    return history


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m meshdit.rollouts.example", description=__doc__.split("\n")[0])
    parser.add_argument("--iterations", type=int, default=4, help="GRPO steps (default: 4)")
    parser.add_argument("--group", type=int, default=4, help="samples per prompt (default: 4)")
    parser.add_argument("--steps", type=int, default=8, help="denoising steps per sample (default: 8)")
    parser.add_argument("--size", type=int, default=128, help="image side in pixels, a multiple of 16 (default: 128; "
                                                               "the bundled model draws no shape much below)")
    parser.add_argument("--train-steps", type=int, default=2,
                        help="denoising steps each iteration trains on, chosen at random (default: 2)")
    parser.add_argument("--lr", type=float, default=1e-4, help="AdamW learning rate (default: 1e-4)")
    parser.add_argument("--seed", type=int, default=0, help="first rollout seed (default: 0)")
    args = parser.parse_args(argv)
    from ..logs import quiet_libraries

    quiet_libraries(False)
    history = grpo(args.iterations, args.group, args.steps, args.size, args.train_steps, args.lr, seed=args.seed)
    if not all(h["replay_equal"] for h in history):
        print("error: a replay differed from its rollout", file=sys.stderr)
        return 1
    print(f"mean reward: {history[0]['reward']:.4f} -> {history[-1]['reward']:.4f}; every replay equalled its "
          "rollout bit for bit")
    return 0


if __name__ == "__main__":
    sys.exit(main())
