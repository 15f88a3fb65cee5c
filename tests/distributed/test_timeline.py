"""The per-rank timeline: spans recorded at the comm primitives of a real 2-rank run, split into
compute / communication / waiting by benchmarks/timeline_chart.py."""
import pytest

from benchmarks.timeline_chart import segments, totals
from tests.distributed import timeline_jobs


@pytest.mark.parametrize("degrees, kinds", [
    (dict(ulysses_degree=2), {"all_to_all", "all_gather"}),
    (dict(ring_degree=2), {"ring_post", "ring_wait", "all_gather"}),
    (dict(pipefusion_parallel_degree=2, warmup_steps=1), {"send_post", "recv", "send_wait", "broadcast"}),
    (dict(cfg_degree=2), {"all_gather"}),
], ids=["ulysses2", "ring2", "pipefusion2", "cfg2"])
def test_two_rank_run_records_its_messages(run_ranks, degrees, kinds):
    ranks = run_ranks(2, timeline_jobs.recorded_generate, degrees)
    for r in ranks:
        assert r["unrecorded"] is None, "spans were kept while recording was off"
        assert kinds <= {kind for kind, *_ in r["spans"]}, f"rank {r['rank']}: {sorted({k for k, *_ in r['spans']})}"
        assert all(r["start"] <= start <= end <= r["end"] for _, start, end, _ in r["spans"])
    if "all_to_all" in kinds or "ring_post" in kinds or degrees.get("cfg_degree"):  # symmetric methods
        assert [k for k, *_ in ranks[0]["spans"]] == [k for k, *_ in ranks[1]["spans"]]
    for r, segs in zip(ranks, segments(ranks)):
        sums = totals(segs)
        assert sum(sums.values()) == pytest.approx(r["end"] - r["start"], rel=1e-6), "segments must tile the window"
        assert sums["communication"] + sums["waiting"] > 0 and sums["compute"] > 0
        assert all(a <= b for _, a, b in segs) and all(s[2] <= t[1] + 1e-12 for s, t in zip(segs, segs[1:]))
