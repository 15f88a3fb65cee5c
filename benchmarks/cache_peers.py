"""meshdit's First-Block Cache beside diffusers' FirstBlockCache hook and cache-dit's DBCache (F1B0), serial, on
the same tiny FLUX.1 pipeline and settings: which steps each cached, and how far each image is from meshdit's.

    python -m benchmarks.cache_peers [--threshold 0.55] [--steps 6]

cache-dit is not a meshdit dependency: install it in your own environment (`pip install cache-dit`); without it
its row says so. docs/caching.md has the figures.
"""
from __future__ import annotations

import argparse

import numpy as np
import torch

PROMPT = "a red cat on a blue square"


def pipeline():
    from meshdit.testing.tiny_models import tiny_pipeline

    pipe = tiny_pipeline("flux-4blocks")
    pipe.set_progress_bar_config(disable=True)
    return pipe


def call(pipe, steps: int):
    with torch.inference_mode():
        return pipe(prompt=PROMPT, height=64, width=48, num_inference_steps=steps, max_sequence_length=16,
                    generator=torch.Generator("cpu").manual_seed(3), output_type="np").images


def main() -> None:
    from tests.cache.test_peers import diffusers_run, meshdit_run

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--threshold", type=float, default=0.55)
    parser.add_argument("--steps", type=int, default=6)
    args = parser.parse_args()
    import tests.cache.test_peers as peers

    peers.SIZE = dict(peers.SIZE, num_inference_steps=args.steps)
    rows = []
    mine, mine_masks = meshdit_run(pipeline(), args.threshold, 1.0)
    rows.append(("meshdit --cache fbcache", [i for i, c in enumerate(mine_masks["cond"]) if c], 0.0))
    theirs, masks = diffusers_run(pipeline(), args.threshold)
    rows.append(("diffusers FirstBlockCacheConfig", [i for i, c in enumerate(masks["cond"]) if c],
                 float(np.abs(theirs - mine).max())))
    try:
        import cache_dit
        from cache_dit import DBCacheConfig
    except ImportError:
        rows.append(("cache-dit DBCache F1B0", "not installed", None))
    else:
        pipe = pipeline()
        cache_dit.enable_cache(pipe, cache_config=DBCacheConfig(
            Fn_compute_blocks=1, Bn_compute_blocks=0, residual_diff_threshold=args.threshold, max_warmup_steps=0,
            max_cached_steps=-1, max_continuous_cached_steps=-1))
        images = call(pipe, args.steps)
        stats = cache_dit.summary(pipe, details=False) if "details" in cache_dit.summary.__code__.co_varnames \
            else cache_dit.summary(pipe)
        cached = sorted(stats[0].cached_steps) if stats else "?"
        rows.append(("cache-dit DBCache F1B0", cached, float(np.abs(images - mine).max())))
    print(f"tiny FLUX.1 (2 double + 2 single blocks), 48 x 64 px, {args.steps} steps, threshold {args.threshold}, "
          "no warmup, no cap\n\n| cache | cached steps | max abs diff vs meshdit |\n|---|---|---|")
    for name, cached, diff in rows:
        print(f"| {name} | {cached} | {'-' if diff is None else f'{diff:.1e}'} |")


if __name__ == "__main__":
    main()
