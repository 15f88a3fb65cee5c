"""Rollouts for reinforcement learning (docs/rl.md): Flow-GRPO's SDE sampler with per-step log-probs (sde.py),
the recorded trajectory (trajectory.py), and the trainer-facing RolloutWorker (meshdit/rollouts/, above the engine)."""
