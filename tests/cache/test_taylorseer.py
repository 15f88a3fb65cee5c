"""StepCache on a toy transformer whose middle block's residual is known at every step: what a cached step adds."""
import pytest
import torch
from torch import nn

from meshdit.cache import CacheSettings
from meshdit.cache.step_cache import StepCache
from meshdit.parallel.plan import BlockList, StagePlan


class Shift(nn.Module):
    """Adds `value(step)` to every token: a block whose residual is known."""

    def __init__(self, value) -> None:
        super().__init__()
        self.value, self.step, self.calls = value, 0, 0

    def forward(self, hidden_states):
        self.calls += 1
        return hidden_states + self.value(self.step)


class Toy(nn.Module):
    def __init__(self, middle) -> None:
        super().__init__()
        self.blocks = nn.ModuleList([Shift(lambda s: 1.0), Shift(middle), Shift(lambda s: 0.5)])

    def forward(self, hidden_states):
        for block in self.blocks:
            hidden_states = block(hidden_states)
        return hidden_states


PLAN = StagePlan(blocks=(BlockList("blocks", ("hidden_states",), "hidden_states"),))


def run(middle, steps: int, **settings):
    """Per step: the toy's output's first value, and whether the middle block ran."""
    toy = Toy(middle)
    fields = dict(threshold=1.0, front_blocks=1, back_blocks=1, max_cached=10) | settings
    cache = StepCache(toy, PLAN, CacheSettings("dbcache", **fields), group=None)
    out = []
    try:
        for step in range(steps):
            cache.begin_step(step)
            for block in toy.blocks:
                block.step = step
            before = toy.blocks[1].calls
            out.append((float(toy(torch.zeros(1, 3, 2))[0, 0, 0]), toy.blocks[1].calls > before))
    finally:
        cache.remove()
    assert not hasattr(toy.blocks[1], "forward") or "forward" not in toy.blocks[1].__dict__  # removed
    return out


def test_cached_steps_reuse_the_last_residual_or_forecast_it():
    linear = lambda s: 2.0 * s + 1.0  # noqa: E731
    plain = run(linear, 4, warmup=2)
    assert [ran for _, ran in plain] == [True, True, False, False]  # the front block's change is 0: cached
    assert [v for v, _ in plain] == [1.0 + 1.0 + 0.5, 1.0 + 3.0 + 0.5, 1.0 + 3.0 + 0.5, 1.0 + 3.0 + 0.5]
    forecast = run(linear, 4, warmup=2, taylorseer=1)
    # order 1 from steps 0 and 1: exact for a residual linear in the step
    assert [v for v, _ in forecast] == pytest.approx([1.0 + linear(s) + 0.5 for s in range(4)])


def test_second_order_uses_two_differences():
    square = lambda s: float(s * s)  # noqa: E731
    out = run(square, 4, warmup=3, taylorseer=2)
    # from 0, 1, 4: first difference 3, second 2 -> 4 + 3 * 1 + 2 * 1 / 2 = 8 at step 3 (backward differences)
    assert out[3] == (pytest.approx(1.0 + 8.0 + 0.5), False)


def test_max_cached_and_static_mask_force_computed_steps():
    out = run(lambda s: float(s), 7, warmup=1, compute_steps=(4,), max_cached=2)
    assert [ran for _, ran in out] == [True, False, False, True, True, False, False]
