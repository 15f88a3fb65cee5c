"""The planner's per-rank memory against measurement on CPU ranks (benchmarks/planner_memory.py): within 15%."""
from __future__ import annotations

import pytest

from benchmarks.planner_memory import compare


@pytest.mark.parametrize("layouts", [["serial", "ulysses2"], ["pp2", "cfg2"]])
def test_predicted_rank_memory_within_15_percent(layouts):
    rows = compare(tokens=256, steps=2, layouts=layouts)
    assert {r["layout"] for r in rows} == set(layouts)
    for r in rows:
        assert 0.85 <= r["ratio"] <= 1.15, r
