"""PipeFusion's stale-K/V error with and without the drift correction on the tests' tiny random models.

    python -m benchmarks.pipefusion_drift [--names flux-4blocks hunyuandit-4blocks]

The layouts and sizes of tests/test_pipefusion.py (1 warmup step of 4; PipeFusion 2 with 3 patches, 4 with
4, 2 x ulysses 2, 2 x ring 2) on a pool of gloo ranks; prints the PSNR of each image against the serial one
with the correction off (`--no-kv-drift-correction`, PipeFusion as published) and on (the default).
"""
from __future__ import annotations

import argparse

LAYOUTS = {"pp2-m3": dict(pipefusion_parallel_degree=2, num_pipeline_patch=3),
           "pp4-m4": dict(pipefusion_parallel_degree=4, num_pipeline_patch=4),
           "pp2-u2": dict(pipefusion_parallel_degree=2, ulysses_degree=2),
           "pp2-r2": dict(pipefusion_parallel_degree=2, ring_degree=2)}


def main() -> None:
    from meshdit.testing.rank_pool import close_all_pools, get_pool, split_layout
    from tests import sp_jobs
    from tests.test_pipefusion import FAMILIES_4, SIZE, STEPS, psnr

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--names", nargs="+", default=FAMILIES_4)
    args = parser.parse_args()
    print("| model | layout | PSNR as published | PSNR with drift correction |\n|---|---|---|---|")
    try:
        for name in args.names:
            serial = sp_jobs.generate_fresh(name, {}, *SIZE, steps=STEPS)[0]
            for layout, degrees in LAYOUTS.items():
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
