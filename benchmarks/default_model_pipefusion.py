"""PipeFusion's error on the bundled model prompt by prompt, by patch count: is the loss spread over every
image, or a few images that end up different?

    python -m benchmarks.default_model_pipefusion [--size 512] [--every 7] [--patches 2 4 8] [--warmup-steps 1]
        [--no-kv-drift-correction]
    python -m benchmarks.default_model_pipefusion --prompt "two green squares on a white background" --patches 2
        (one prompt of your own instead, seed 0: the figure `meshdit generate --help` quotes)

Serial images first, then PipeFusion 2 with each patch count on a pool of 2 gloo ranks; prints the PSNR of
each prompt's image against serial (seed i for the i-th prompt taken, the model's defaults otherwise) and
the score.
"""
from __future__ import annotations

import argparse

import numpy as np


def main() -> None:
    from benchmarks.default_model_layouts import generate_all
    from default_model import dataset
    from default_model.evaluate import score_image
    from meshdit.testing.rank_pool import close_all_pools, get_pool

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--size", type=int, default=None, help="height and width (default: the model's 256)")
    parser.add_argument("--every", type=int, default=7, help="every k-th held-out prompt (7: one per layout)")
    parser.add_argument("--patches", type=int, nargs="+", default=[2, 4, 8])
    parser.add_argument("--warmup-steps", type=int, default=1)
    parser.add_argument("--prompt", default=None, help="this prompt alone instead of the held-out ones")
    parser.add_argument("--no-kv-drift-correction", action="store_true",
                        help="stale K/V as published, as `meshdit generate --no-kv-drift-correction`")
    args = parser.parse_args()
    prompts = [args.prompt] if args.prompt else list(dataset.EVAL_PROMPTS[:: args.every])
    serial, _ = generate_all({}, prompts, 0, size=args.size)

    def scored(images):
        return sum(score_image(img, p) for img, p in zip(images, prompts))

    print(f"{len(prompts)} prompts at {args.size or 256} px, {args.warmup_steps} warmup step(s), drift correction "
          f"{'off' if args.no_kv_drift_correction else 'on'}; "
          f"serial score {scored(serial)}/{len(prompts)}")
    try:
        for patches in args.patches:
            degrees = dict(pipefusion_parallel_degree=2, warmup_steps=args.warmup_steps, num_pipeline_patch=patches,
                           kv_drift_correction=not args.no_kv_drift_correction)
            images, _ = get_pool(2).run(generate_all, degrees, prompts, 0, None, args.size, timeout=3600)[0]
            mse = ((images - serial) ** 2).mean(axis=(1, 2, 3))  # [prompts]
            per_prompt = " ".join(f"{10 * np.log10(1 / m):.1f}" for m in mse)
            print(f"{patches} patches: PSNR {10 * np.log10(1 / mse.mean()):.1f} dB (per prompt: {per_prompt}), "
                  f"score {scored(images)}/{len(prompts)}", flush=True)
    finally:
        close_all_pools()


if __name__ == "__main__":
    main()
