"""Jobs the step-cache tests run on every rank of the pool (module-level: they are pickled)."""
from __future__ import annotations

import torch

from meshdit.cache import CacheSettings
from meshdit.cache import signal, step_cache
from meshdit.engine import Engine
from meshdit.testing.rank_pool import mesh_for, split_layout
from tests.parallel import sp_jobs

SIZE = (36, 44)  # 9 x 11 = 99 image tokens: uneven over 2 and 4 ranks
STEPS = 6


def generate_cached(name: str, degrees: dict, cache: dict | None, prompts=None, rule: str = "global",
                    fields: dict | None = None):
    """(images, skip masks {(branch, image): (cached per step)} or None) of one generation over the layout.

    rule "averaged": the peers' decision rule (the average of per-rank means) replaces the global sums, to show
    that the tests tell them apart. fields: other request fields (a video's num_frames)."""
    config, settings = split_layout(degrees)
    if config.pipefusion_parallel_degree > 1:  # PipeFusion frees other stages' blocks: a pipeline of its own
        from meshdit.testing.tiny_models import tiny_pipeline

        pipe = tiny_pipeline(name)
        pipe.set_progress_bar_config(disable=True)
    else:
        pipe = sp_jobs.pipeline(name)
    engine = Engine(pipe, mesh_for(config) if config.world_size > 1 or config.compile else None)
    original = step_cache.relative_change
    if rule == "averaged":
        step_cache.relative_change = signal.averaged_means_change
    try:
        request = sp_jobs.request(name, *sp_jobs.image_test_size(name, *SIZE), steps=STEPS, prompts=prompts,
                                  cache=CacheSettings(**cache) if cache else CacheSettings(), **settings,
                                  **(fields or {}))
        result = engine.generate(request)
        return result.images, None if result.cache is None else dict(result.cache.masks)
    finally:
        step_cache.relative_change = original
        engine.close()


def first_signals(name: str, degrees: dict, cache: dict, prompts=None):
    """The first change signal of the generation (step `warmup`, the first that can be cached, whose inputs no
    earlier decision changed) under both rules, on this rank: (global sums [B], averaged means [B])."""
    seen = []
    original = step_cache.relative_change

    def spy(current, previous, group):
        if not seen:
            seen.append((signal.relative_change(current, previous, group).tolist(),
                         signal.averaged_means_change(current, previous, group).tolist()))
        return original(current, previous, group)

    step_cache.relative_change = spy
    try:
        generate_cached(name, degrees, cache, prompts)
    finally:
        step_cache.relative_change = original
    return seen[0]



def compiled_cached(name: str, degrees: dict, cache: dict, prompts=None):
    """generate_cached with every block compiled (aot_eager through tests/parallel's graph-counting backend):
    (images, skip masks, graphs compiled, graphs run)."""
    from tests.parallel import compile_jobs

    compile_jobs._register_counting_backend()
    torch._dynamo.reset()
    compile_jobs._Graphs.compiled = compile_jobs._Graphs.runs = 0
    images, masks = generate_cached(name, dict(degrees, compile=compile_jobs.COUNTING), cache, prompts)
    return images, masks, compile_jobs._Graphs.compiled, compile_jobs._Graphs.runs


def generate_presets(name: str, degrees: dict, caches: list[dict], prompts=None, fields: dict | None = None,
                     steps: int = STEPS):
    """generate_cached for each of `caches` (CacheSettings fields) in turn on one engine: [(images, masks), ...]."""
    config, settings = split_layout(degrees)
    engine = Engine(sp_jobs.pipeline(name), mesh_for(config) if config.world_size > 1 else None)
    try:
        results = []
        for cache in caches:
            request = sp_jobs.request(name, *sp_jobs.image_test_size(name, *SIZE), steps=steps, prompts=prompts,
                                      cache=CacheSettings(**cache), **settings, **(fields or {}))
            result = engine.generate(request)
            results.append((result.images, dict(result.cache.masks)))
        return results
    finally:
        engine.close()
