"""benchmarks/planner_regret.py's bookkeeping, and the README's regret figures against the committed runs."""
from __future__ import annotations

import os
import re

from benchmarks.planner_regret import _load, summary

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
RESULTS = [os.path.join(ROOT, "benchmarks", "results", name)
           for name in ("planner_regret_small.json", "planner_regret_4096.json")]


def _cell(regret: float, predictions: list[tuple[float, float]]) -> dict:
    layouts = {f"layout{i}": {"measured_s": m, "predicted_s": p, "exact": True} for i, (m, p) in enumerate(predictions)}
    return {"model": "benchmark", "tokens": 256, "cfg": False, "ranks": 2, "pick": "layout0", "best": "layout0",
            "regret": regret, "layouts": layouts}


def test_summary_counts_cells_within_5_percent_and_predictions_within_25():
    cells = [_cell(0.0, [(1.0, 1.2), (2.0, 1.0)]), _cell(0.05, [(1.0, 0.74)]), _cell(0.051, [(1.0, 1.25)])]
    result = summary(cells)
    assert (result["cells_within"], result["cells"]) == (2, 3)
    assert (result["predicted_within"], result["layouts"]) == (2, 4)  # 1.2 and 1.25 in, 0.5 and 0.74 out
    assert result["worst_regret"] == 0.051
    assert result["per_model"]["benchmark"]["ratio_range"] == (0.5, 1.25)


def test_readme_regret_figures_are_those_of_the_committed_runs():
    result = summary([c for path in RESULTS for c in _load(path)])
    with open(os.path.join(ROOT, "README.md"), encoding="utf-8") as f:
        readme = f.read()
    match = re.search(r"(\d+) of (\d+) cells within 5% of the measured best; (\d+) of (\d+) layouts' predicted time "
                      r"within 25%; worst cell ([0-9.]+)%", readme)
    assert match, "README: the regret summary line is missing"
    assert [int(g) for g in match.groups()[:4]] == [result["cells_within"], result["cells"],
                                                     result["predicted_within"], result["layouts"]]
    assert float(match.group(5)) == round(result["worst_regret"] * 100, 1)
    for model, name in (("benchmark", "the benchmark model"), ("wan", "the video model")):
        m = result["per_model"][model]
        low, high = m["ratio_range"]
        quoted = (f"{m['predicted_within']} of {m['layouts']} layouts within 25%, " if model == "benchmark" else "") + \
            f"{low:.2f}–{high:.2f}×"
        assert f"for {name} ({quoted}" in readme.replace("\n", " "), (name, quoted)
