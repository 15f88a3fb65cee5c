"""What a trainer drives, above the engine: RolloutWorker (worker.py: group rollouts, replay, weight sync; what a Ray
actor wraps) and the GRPO example (`python -m meshdit.rollouts.example`). The sampling itself is meshdit/rl/, below
the engine (docs/rl.md)."""
