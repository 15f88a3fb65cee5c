"""benchmarks/cache_chart.py: the points it draws from benchmarks/cache.py's rows, and cache-dit's published ones."""
from benchmarks.cache_chart import PUBLISHED, series, svg


def row(cache, layout, psnr, cpu, wall):
    return dict(model="benchmark-50", tokens=4096, steps=50, layout=layout, cache=cache, computed=15, total=50,
                wall_s=1.0, cpu_s=1.0, speedup_wall=wall, speedup_cpu=cpu, psnr_db=psnr)


RECORDS = [{"rows": [row("uncached", "serial", float("inf"), 1.0, 1.0), row("fast (preset)", "serial", 60.0, 2.0, 1.7),
                     row("fbcache (preset)", "serial", float("inf"), 1.0, 1.0),  # skipped nothing: no PSNR
                     row("fast (preset)", "ulysses 2", 60.0, 1.9, 2.1)]}]


def test_points_are_the_cached_rows_with_a_finite_psnr():
    assert series(RECORDS) == {("benchmark-50, 4096 tokens", "serial"): [("fast (preset)", 60.0, 2.0)],
                               ("benchmark-50, 4096 tokens", "ulysses 2"): [("fast (preset)", 60.0, 1.9)]}
    assert series(RECORDS, wall=True)[("benchmark-50, 4096 tokens", "serial")] == [("fast (preset)", 60.0, 1.7)]


def test_chart_draws_every_point_and_the_published_ones_marked_as_such():
    drawn = svg(series(RECORDS), "t", "CPU time")
    assert drawn.count('r="4.5" fill') == 1 + 1  # the serial point + the model's legend entry
    assert drawn.count('width="8" height="8"') == 1  # the ulysses 2 point
    assert drawn.count('fill="none" stroke="#555"') == len(PUBLISHED) + 1  # + its legend marker
    assert "published, other model" in drawn
