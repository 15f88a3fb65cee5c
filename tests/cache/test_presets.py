"""Every named cache preset (--cache fast, fbcache, dbcache) on every family, serial and under Ulysses 2: it runs
(SD3's last block returns no text stream, which fbcache's last skipped block used to subtract from: a TypeError at
step 0), and cached Ulysses 2 equals cached serial (the same skip mask, the same images)."""
import numpy as np
import pytest

from meshdit.cache_settings import CHOICES
from meshdit.models.registry import family_for_pipeline
from meshdit.testing.tiny_models import tiny_families
from tests.cache import cache_jobs
from tests.parallel import sp_jobs

FAMILIES = [m.TESTS.four_blocks for _, m in tiny_families()]
# each preset's own blocks, warmup and cap; a threshold every change is under, so every step after the warmup that
# the cap allows is cached (fast: warmup 4, so 5 steps leave one cached step)
CACHES = [dict(method=preset, threshold=1e6) for preset in CHOICES]
STEPS = 5


def _text(masks):
    return {k: "".join("c" if c else "." for c in m) for k, m in masks.items()}


@pytest.mark.parametrize("name", FAMILIES)
def test_every_preset_runs_and_ulysses2_equals_serial(run_ranks, name):
    frames = {"num_frames": 9} if family_for_pipeline(type(sp_jobs.pipeline(name)).__name__).is_video else {}
    serial = cache_jobs.generate_presets(name, {}, CACHES, fields=frames, steps=STEPS)
    for cache, (_, masks) in zip(CACHES, serial):
        flat = [c for m in masks.values() for c in m]
        assert any(flat) and not all(flat), f"{cache['method']}: some steps cached, some computed: {_text(masks)}"
    results = run_ranks(2, cache_jobs.generate_presets, name, dict(ulysses_degree=2), CACHES, fields=frames,
                        steps=STEPS)
    for rank, mine in enumerate(results):
        for cache, (images, masks), (ref, ref_masks) in zip(CACHES, mine, serial):
            assert _text(masks) == _text(ref_masks), f"rank {rank}, {cache['method']}: skip mask differs from serial"
            assert np.abs(images - ref).max() <= 1e-5 * np.abs(ref).max(), f"rank {rank}, {cache['method']}"
