"""PipeFusion's stale-K/V error with and without the drift correction on the tests' tiny random models.

    python -m benchmarks.pipefusion_drift [--names flux-4blocks hunyuandit-4blocks] [--cost-only]

First its cost: one attention call's time against the correction's (copy the patch's last values, shift the
later patches' values), one thread, at the bundled model's sizes and FLUX.1-dev's. Then the layouts and
sizes of tests/parallel/test_pipefusion.py (1 warmup step of 4; PipeFusion 2 with 3 patches, 4 with 4, 2 x ulysses 2,
2 x ring 2) on a pool of gloo ranks; prints the PSNR of each image against the serial one with the
correction off (`--no-kv-drift-correction`, PipeFusion as published) and on (the default).
"""
from __future__ import annotations

import argparse

# (name, heads, text tokens, image tokens, head dim): one attention call of a patch step with 2 patches
COST_SIZES = [("bundled model, 256 px", 4, 32, 256, 32), ("bundled model, 512 px", 4, 32, 1024, 32),
              ("FLUX.1-dev, 1024 px", 24, 512, 4096, 128)]


def print_cost() -> None:
    import time

    import torch
    import torch.nn.functional as F

    from meshdit.attention.stale_kv import _shift_stale_values

    torch.set_num_threads(1)

    def seconds(fn) -> float:  # median of 7 timed runs, after one warm-up
        fn()
        runs = []
        for _ in range(7):
            start = time.perf_counter()
            fn()
            runs.append(time.perf_counter() - start)
        return sorted(runs)[3]

    print("| size | attention call | drift correction | correction / attention |\n|---|---|---|---|")
    for name, heads, text, image, dim in COST_SIZES:
        patch = image // 2
        q = torch.randn(1, heads, patch, dim)  # [B, H, patch tokens, D]
        k, v = torch.randn(2, 1, heads, text + image, dim)  # [B, H, all tokens, D]
        attention = seconds(lambda: F.scaled_dot_product_attention(q, k, v))
        correction = seconds(lambda: _shift_stale_values(v, v.narrow(2, text, patch).clone(), text, (0, patch), image))
        print(f"| {name} | {attention * 1e3:.3f} ms | {correction * 1e3:.3f} ms | {100 * correction / attention:.1f} % |",
              flush=True)


def main() -> None:
    from meshdit.testing.rank_pool import close_all_pools, get_pool, split_layout
    from tests.parallel import sp_jobs
    from tests.parallel.test_pipefusion import FAMILIES_4, ONE_WARMUP_LAYOUTS, SIZE, STEPS, psnr, reference

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--names", nargs="+", default=FAMILIES_4)
    parser.add_argument("--cost-only", action="store_true", help="the cost table alone")
    args = parser.parse_args()
    print_cost()
    if args.cost_only:
        return
    print("| model | layout | PSNR as published | PSNR with drift correction |\n|---|---|---|---|")
    try:
        for name in args.names:
            serial = reference(name)
            for layout, degrees in ONE_WARMUP_LAYOUTS.items():
                quality = []
                for correct in (False, True):
                    settings = dict(degrees, warmup_steps=1, kv_drift_correction=correct)
                    world = split_layout(settings)[0].world_size
                    image = get_pool(world).run(sp_jobs.generate_fresh, name, settings, *SIZE, steps=STEPS)[0][0]
                    quality.append(psnr(image, serial))
                print(f"| {name} | {layout} | {quality[0]:.1f} dB | {quality[1]:.1f} dB |", flush=True)
    finally:
        close_all_pools()


if __name__ == "__main__":
    main()
