"""Step caching under every layout equals cached serial: the same image (<= 1e-5 x max) and the same skip mask."""
import numpy as np
import pytest

from meshdit.config import ParallelConfig
from meshdit.models.registry import family_for_pipeline
from meshdit.testing.rank_pool import split_layout
from meshdit.testing.tiny_models import tiny_families
from tests.cache import cache_jobs
from tests.parallel import sp_jobs

PROMPTS = ["a red cat", "a blue dog"]
# Per family a cache whose serial run on these tiny random models both skips and computes steps (asserted:
# a test where nothing is cached proves nothing). flux-4blocks: front d0, middle d1 | s0 (two segments), back s1.
CACHES = {
    "flux-4blocks": dict(method="dbcache", threshold=0.55, front_blocks=1, back_blocks=1, warmup=1, max_cached=2),
    "sd35-4blocks": dict(method="dbcache", threshold=0.45, front_blocks=1, back_blocks=1, warmup=1, max_cached=2,
                         taylorseer=2),
    "pixart-sigma-4blocks": dict(method="fbcache", threshold=0.1, warmup=1, max_cached=2),
    "wan-4blocks": dict(method="dbcache", threshold=0.1, front_blocks=1, back_blocks=1, warmup=1, max_cached=2),
}
_SERIAL: dict = {}


def serial(name, prompts=PROMPTS, cache=None):
    key = (name, tuple(prompts), repr(cache))
    if key not in _SERIAL:
        _SERIAL[key] = cache_jobs.generate_cached(name, {}, cache or CACHES[name], prompts)
    return _SERIAL[key]


def text(masks):
    return {k: "".join("c" if c else "." for c in m) for k, m in masks.items()}


def assert_mixed(masks):
    flat = [c for m in masks.values() for c in m]
    assert any(flat) and not all(flat), f"the cache must skip some steps and compute others: {text(masks)}"


def check(results, ref_images, ref_masks):
    for rank, (images, masks) in enumerate(results):
        assert text(masks) == text(ref_masks), f"rank {rank}: skip mask differs from serial"
        assert np.abs(images - ref_images).max() <= 1e-5 * np.abs(ref_images).max(), f"rank {rank}: images differ"


LAYOUTS = [dict(ulysses_degree=2), dict(ring_degree=2), dict(cfg_degree=2), dict(data_parallel_degree=2),
           dict(pipefusion_parallel_degree=2, warmup_steps=cache_jobs.STEPS)]


@pytest.mark.parametrize("degrees", LAYOUTS, ids=["u2", "r2", "cfg2", "dp2", "pf2-full-warmup"])
@pytest.mark.parametrize("name", list(CACHES))
def test_cached_layout_equals_cached_serial(run_ranks, name, degrees):
    # wan-4blocks at its default 81 frames (2079 tokens): its tiny VAE's former one-channel RMS norms (a sign
    # function) once turned ring 2 / data 2's 1e-7 rounding into 0.1-0.24 here (docs/exactness.md)
    ref_images, ref_masks = serial(name)
    assert_mixed(ref_masks)
    results = run_ranks(split_layout(degrees)[0].world_size, cache_jobs.generate_cached, name, degrees,
                        CACHES[name], PROMPTS)
    check(results, ref_images, ref_masks)


# Every other family once, under Ulysses 2: a threshold no change reaches and one cached step at a time make the
# serial mask compute, cache, compute, ... on any weights, so each family's cached path (the middle blocks'
# residual reused on split tokens) is compared with its cached serial run.
OTHER_FAMILIES = [m.TESTS.four_blocks for f, m in tiny_families() if m.TESTS.four_blocks not in CACHES]
ALTERNATE = dict(method="fbcache", threshold=1e6, warmup=1, max_cached=1)


@pytest.mark.parametrize("name", OTHER_FAMILIES)
def test_every_family_cached_ulysses2_equals_cached_serial(run_ranks, name):
    frames = {"num_frames": 9} if family_for_pipeline(type(sp_jobs.pipeline(name)).__name__).is_video else {}
    ref_images, ref_masks = cache_jobs.generate_cached(name, {}, ALTERNATE, PROMPTS[:1], fields=frames)
    assert_mixed(ref_masks)
    results = run_ranks(2, cache_jobs.generate_cached, name, dict(ulysses_degree=2), ALTERNATE, PROMPTS[:1],
                        fields=frames)
    check(results, ref_images, ref_masks)


@pytest.mark.parametrize("degrees", [dict(ulysses_degree=2, ring_degree=2), dict(cfg_degree=2, ulysses_degree=2)],
                         ids=["u2r2", "cfg2-u2"])
def test_cached_hybrids_equal_cached_serial(run_ranks, degrees):
    name = "flux-4blocks"
    ref_images, ref_masks = serial(name)
    assert_mixed(ref_masks)
    results = run_ranks(ParallelConfig(**degrees).world_size, cache_jobs.generate_cached, name, degrees,
                        CACHES[name], PROMPTS)
    check(results, ref_images, ref_masks)


def test_threshold_zero_is_bit_for_bit_uncached():
    name = "flux-4blocks"
    plain, none = cache_jobs.generate_cached(name, {}, None, PROMPTS)
    cached, masks = cache_jobs.generate_cached(name, {}, dict(CACHES[name], threshold=0.0), PROMPTS)
    assert none is None and not any(c for m in masks.values() for c in m)
    assert np.array_equal(plain, cached)


def test_averaged_means_rule_differs_from_serial_on_an_uneven_split(run_ranks):
    """99 tokens over Ulysses 2 (50 + 49): the average of the two ranks' mean ratios is not the global ratio.
    With the threshold between the two values at the first decidable step, serial and meshdit's Ulysses 2
    cache that step, the peers' rule computes it (or the other way round)."""
    name, degrees = "flux-4blocks", dict(ulysses_degree=2)
    base = dict(CACHES[name], max_cached=1)
    exact, averaged = run_ranks(2, cache_jobs.first_signals, name, degrees, base, PROMPTS)[0]
    serial_signal = cache_jobs.first_signals(name, {}, base, PROMPTS)[0]
    # global sums: the serial value, up to the float32 rounding of the sharded attention; the gap between the
    # two rules must be far above that rounding, so the threshold between them is not on a knife edge
    # (docs/caching.md gives both values)
    np.testing.assert_allclose(exact, serial_signal, rtol=1e-6)
    gap = [abs(a - e) for a, e in zip(averaged, exact)]
    assert max(gap) > 1e-5, f"the split must make the averaged rule differ: {exact} vs {averaged}"
    row = int(np.argmax(gap))
    print(f"first signal, image {row}: global sums {exact[row]:.6f}, averaged means {averaged[row]:.6f}")
    cache = dict(base, threshold=(exact[row] + averaged[row]) / 2)
    ref_images, ref_masks = serial(name, cache=cache)
    mine = run_ranks(2, cache_jobs.generate_cached, name, degrees, cache, PROMPTS)
    check(mine, ref_images, ref_masks)
    peers = run_ranks(2, cache_jobs.generate_cached, name, degrees, cache, PROMPTS, rule="averaged")
    for rank, (images, masks) in enumerate(peers):
        assert text(masks) != text(ref_masks), f"rank {rank}: the averaged rule should decide differently"
        assert np.abs(images - ref_images).max() > 1e-5 * np.abs(ref_images).max()
