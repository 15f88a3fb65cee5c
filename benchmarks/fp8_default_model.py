"""The bundled model's 56 held-out prompts with each FP8 option and all together, per layout.

    python -m benchmarks.fp8_default_model [--limit N] [--only "serial all;ulysses 2 comm"]

Score (bound: at most 2 points below the fp32 SDPA serial score) and PSNR of the images against
that serial run; rows are appended to benchmarks/results/fp8_default_model.md as each finishes.
PipeFusion runs with full warmup, so the only difference from serial is FP8's; except for
--fp8-stale-kv, which only acts on patch steps: it runs with 1 warmup step, beside the same layout
without FP8.
"""
from __future__ import annotations

import argparse

import numpy as np

from benchmarks.default_model_layouts import LAYOUTS as _ALL
from benchmarks.default_model_layouts import generate_all

LAYOUTS = {name: _ALL[name] for name in ("serial", "ulysses 2", "ring 2", "pipefusion 2, full warmup",
                                        "pipefusion 2, 1 warmup step")}
OPTIONS = {
    "gemm": dict(gemm=True),
    "attn": dict(attention="fp8"),
    "comm": dict(comm=True),
    "all": dict(gemm=True, attention="fp8", comm=True, comm_k=True),
    "stale-kv": dict(stale_kv=True),
}
# the most telling runs first: a partial run still covers every option and every layout
ORDER = [("serial", "none"), ("serial", "all"), ("ulysses 2", "all"), ("ring 2", "all"),
         ("pipefusion 2, full warmup", "all"), ("serial", "gemm"), ("serial", "attn"), ("ulysses 2", "comm"),
         ("ring 2", "comm"), ("pipefusion 2, full warmup", "comm"), ("ulysses 2", "gemm"), ("ulysses 2", "attn"),
         ("ring 2", "gemm"), ("ring 2", "attn"), ("pipefusion 2, full warmup", "gemm"),
         ("pipefusion 2, full warmup", "attn"), ("pipefusion 2, 1 warmup step", "none"),
         ("pipefusion 2, 1 warmup step", "stale-kv")]


def main() -> None:
    from default_model import dataset
    from default_model.evaluate import score_image
    from meshdit.testing.rank_pool import close_all_pools, get_pool, split_layout

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--limit", type=int, default=None, help="only the first N evaluation prompts")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--only", default=None, help='";"-separated "LAYOUT OPTION" runs (default: all)')
    parser.add_argument("--out", default="benchmarks/results/fp8_default_model.md")
    args = parser.parse_args()
    prompts = list(dataset.EVAL_PROMPTS[: args.limit] if args.limit else dataset.EVAL_PROMPTS)
    order = ORDER if not args.only else [tuple(r.strip().rsplit(" ", 1)) for r in args.only.split(";")]
    if order[0] != ("serial", "none"):
        order = [("serial", "none")] + order  # the reference
    with open(args.out, "w") as f:
        f.write(f"Default model, {len(prompts)} held-out prompts, seeds {args.seed}..{args.seed + len(prompts) - 1}, "
                "fp32 on CPU (`python -m benchmarks.fp8_default_model`); reference: serial, SDPA, no FP8\n\n"
                "| layout | FP8 option | ranks | score | change (points) | PSNR vs fp32 serial | s / image |\n"
                "|---|---|---|---|---|---|---|\n")
    serial = base = None
    try:
        for layout, option in order:
            degrees, fp8 = LAYOUTS[layout], OPTIONS.get(option)
            world = split_layout(degrees)[0].world_size
            if world == 1:
                images, seconds = generate_all(degrees, prompts, args.seed, fp8)
            else:
                results = get_pool(world).run(generate_all, degrees, prompts, args.seed, fp8, timeout=3600)
                images, seconds = results[-1]  # PipeFusion: the last stage holds the images
            score = 100.0 * sum(score_image(img, p) for img, p in zip(images, prompts)) / len(prompts)
            if serial is None:
                serial, base = images, score
            mse = float(((images - serial) ** 2).mean())
            psnr = float("inf") if mse == 0 else 10 * np.log10(1.0 / mse)
            row = (f"| {layout} | {option} | {world} | {score:.1f}% | {score - base:+.1f} | {psnr:.1f} dB | "
                   f"{seconds / len(prompts):.2f} |")
            print(row, flush=True)
            with open(args.out, "a") as f:
                f.write(row + "\n")
    finally:
        close_all_pools()


if __name__ == "__main__":
    main()
