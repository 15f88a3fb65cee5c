"""--compile with --cache: compiled blocks under the cache's hooks give the eager cached image and skip mask.

The cache's hooks sit on compiled blocks: the decision and the segment hooks are compiler-disabled, and the
middle blocks' skip switch (a Python attribute) is read inside the compiled block call, so dynamo guards on it.
aot_eager through tests/parallel's graph-counting backend (the same graphs and breaks as inductor, no code
generation); the count proves the blocks were compiled.
"""
import numpy as np
import pytest

from tests.cache import cache_jobs
from tests.cache.test_rank_agreement import CACHES, PROMPTS, assert_mixed, serial, text


@pytest.mark.parametrize("degrees", [{}, dict(ulysses_degree=2)], ids=["serial", "u2"])
def test_compiled_cached_equals_eager_cached(run_ranks, degrees):
    name = "flux-4blocks"
    ref_images, ref_masks = serial(name)
    assert_mixed(ref_masks)
    world = 2 if degrees else 1
    for rank, (images, masks, compiled, runs) in enumerate(
            run_ranks(world, cache_jobs.compiled_cached, name, degrees, CACHES[name], PROMPTS)):
        assert compiled > 0 and runs > 0, f"rank {rank}: no block was compiled ({compiled} graphs, {runs} runs)"
        assert text(masks) == text(ref_masks), f"rank {rank}: compiled skip mask differs from eager serial"
        assert np.abs(images - ref_images).max() <= 1e-5 * np.abs(ref_images).max(), f"rank {rank}: images differ"
