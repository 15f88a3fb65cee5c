"""The trainer's-view example (python -m meshdit.rollouts.example, docs/rl.md) runs: a few GRPO steps on the bundled model,
every replay equal to its rollout bit for bit, the weights synced to the worker after each step."""


def test_grpo_example_replays_every_rollout_bit_for_bit_and_trains():
    from meshdit.rollouts.example import grpo

    lines = []
    history = grpo(iterations=2, group=2, log=lines.append)
    assert len(history) == 2 and len(lines) == 2
    # iteration 1's replay runs on weights the trainer changed and pushed with update_weights: equal only if the
    # worker took them exactly
    assert all(h["replay_equal"] for h in history), lines
    assert all(h["grad_norm"] > 0 for h in history), "no gradient reached the transformer"
    assert 0 <= history[0]["reward"] <= 1
