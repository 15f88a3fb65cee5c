"""Scores the bundled default model's held-out prompts under several layouts (issue: same score under
every exact layout; PipeFusion with one warmup step loses at most 2 points).

    python -m benchmarks.default_model_layouts [--limit N] [--seed S ...] [--size 512]
        [--layouts "ulysses 2;pipefusion 2, 1 warmup step"]
        [--out FILE]   (default benchmarks/results/default_model_layouts[_SIZE].md)

Every layout generates each evaluation prompt with seed (S + index), like
`python -m default_model.evaluate`, through meshdit's Engine on a pool of gloo ranks. One 56-prompt set
moves by a prompt or two either way under an approximate layout, so several seeds (`--seed 0 1000 2000`, as
evaluate pools them) score every set and the pooled score, and the table counts the prompts whose verdict
changed against serial (lost / gained).
"""
from __future__ import annotations

import argparse
import shlex
import sys
import time

import numpy as np

LAYOUTS = {
    "serial": {},
    "ulysses 2": dict(ulysses_degree=2),
    "ring 2": dict(ring_degree=2),
    "ulysses 2 x ring 2": dict(ulysses_degree=2, ring_degree=2),
    "cfg 2": dict(cfg_degree=2),
    "pipefusion 2, full warmup": dict(pipefusion_parallel_degree=2, warmup_steps=10_000),
    "pipefusion 2, 1 warmup step": dict(pipefusion_parallel_degree=2, warmup_steps=1),
    "pipefusion 4, 1 warmup step": dict(pipefusion_parallel_degree=4, warmup_steps=1),
}
# Only with --layouts: more warmup steps, where one is not enough (512 px)
MORE_WARMUP = {f"pipefusion {pp}, {n} warmup steps": dict(pipefusion_parallel_degree=pp, warmup_steps=n)
               for pp, n in ((2, 2), (2, 3), (2, 5), (2, 19), (4, 3), (4, 5))}
# ... and each PipeFusion layout with stale K/V as published (--no-kv-drift-correction)
MORE_WARMUP |= {f"{name}, no drift correction": dict(degrees, kv_drift_correction=False)
                for name, degrees in (LAYOUTS | MORE_WARMUP).items()
                if "pipefusion" in name and "full warmup" not in name}


def generate_all(degrees: dict, prompts: list[str], seed: int, fp8_kwargs: dict | None = None, size: int | None = None):
    """Runs on every rank: the default model over `degrees`; returns all images (rank results agree)."""
    import torch
    from diffusers import FluxPipeline

    from meshdit import default_model as dm
    from meshdit.config import GenerateRequest
    from meshdit.engine import Engine
    from meshdit.testing.rank_pool import mesh_for, split_layout

    torch.set_num_threads(1)  # like the CLI's ranks (and the pool's)
    config, settings = split_layout(degrees)
    pipe = FluxPipeline.from_pretrained(dm.weights_path())
    pipe.set_progress_bar_config(disable=True)
    fp8 = None
    if fp8_kwargs:  # benchmarks.fp8_default_model: the same runs with FP8 options
        from meshdit.quant.settings import Fp8Config

        fp8 = Fp8Config(**fp8_kwargs)
    engine = Engine(pipe, mesh_for(config) if config.world_size > 1 else None, fp8=fp8)
    images, start = [], time.perf_counter()
    with torch.inference_mode():
        for i, prompt in enumerate(prompts):
            request = GenerateRequest(
                prompt=prompt, negative_prompt=dm.DEFAULT_NEGATIVE_PROMPT, height=size or dm.DEFAULT_HEIGHT,
                width=size or dm.DEFAULT_WIDTH, num_inference_steps=dm.DEFAULT_STEPS, guidance_scale=dm.DEFAULT_GUIDANCE,
                seed=seed + i, extra={"max_sequence_length": dm.DEFAULT_MAX_SEQUENCE_LENGTH}, **settings)
            images.append(engine.generate(request).images[0])
    engine.close()
    return np.stack(images), time.perf_counter() - start


def main() -> None:
    from default_model import dataset
    from default_model.evaluate import score_image
    from meshdit.testing.rank_pool import close_all_pools, get_pool, split_layout

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--limit", type=int, default=None, help="only the first N evaluation prompts")
    parser.add_argument("--seed", type=int, nargs="+", default=[0],
                        help="seed of the first prompt; several: every layout scores each seed set and their pooled score")
    parser.add_argument("--size", type=int, default=None, help="height and width (default: the model's 256)")
    parser.add_argument("--layouts", default=None,
                        help=f"';'-separated subset of: {'; '.join(LAYOUTS | MORE_WARMUP)} (serial always runs first)")
    parser.add_argument("--out", default=None,
                        help="table file (default benchmarks/results/default_model_layouts[_SIZE].md)")
    args = parser.parse_args()
    out = args.out or f"benchmarks/results/default_model_layouts{f'_{args.size}' if args.size else ''}.md"
    prompts = list(dataset.EVAL_PROMPTS[: args.limit] if args.limit else dataset.EVAL_PROMPTS)
    choices = LAYOUTS | MORE_WARMUP
    names = list(LAYOUTS) if args.layouts is None else ["serial"] + [
        n.strip() for n in args.layouts.split(";") if n.strip() not in ("", "serial")]
    unknown = [n for n in names if n not in choices]
    if unknown:
        raise SystemExit(f"unknown layouts {unknown}; choose from: {'; '.join(choices)}")
    rows, serial_images, serial_verdicts = [], None, None
    try:
        for name in names:
            degrees = choices[name]
            world = split_layout(degrees)[0].world_size
            runs = []  # per seed set: (images [N, H, W, 3], seconds)
            for seed in args.seed:
                if world == 1:
                    runs.append(generate_all(degrees, prompts, seed, size=args.size))
                else:
                    runs.append(get_pool(world).run(generate_all, degrees, prompts, seed, None, args.size,
                                                    timeout=3600)[0])
            images = np.concatenate([r[0] for r in runs])  # [seed sets x prompts, H, W, 3]
            seconds = sum(r[1] for r in runs) / len(images)
            verdicts = np.array([score_image(img, p) for img, p in zip(images, prompts * len(args.seed))], dtype=bool)
            if serial_images is None:
                serial_images, serial_verdicts = images, verdicts
            per_set = [100.0 * v.mean() for v in np.split(verdicts, len(args.seed))]
            lost, gained = int((serial_verdicts & ~verdicts).sum()), int((verdicts & ~serial_verdicts).sum())
            diff = float(np.abs(images - serial_images).max())
            mse = float(((images - serial_images) ** 2).mean())
            psnr = float("inf") if mse == 0 else 10 * np.log10(1.0 / mse)
            rows.append((name, world, 100.0 * verdicts.mean(), per_set, lost, gained, diff, psnr, seconds))
            print(f"{name}: score {100.0 * verdicts.mean():.1f}% (per seed set "
                  f"{' / '.join(f'{x:.1f}%' for x in per_set)}; verdicts lost {lost}, gained {gained})  "
                  f"max|diff| {diff:.2e}  PSNR {psnr:.1f} dB  {seconds:.2f} s/image", flush=True)
    finally:
        close_all_pools()
    size = args.size or 256
    seeds = ", ".join(f"{s}..{s + len(prompts) - 1}" for s in args.seed)
    pooled = len(args.seed) > 1
    lines = [f"Default model, {len(prompts)} held-out prompts at {size}x{size}, seeds {seeds}"
             f"{' (score pooled over the seed sets)' if pooled else ''} "
             f"(`{shlex.join(['python', '-m', 'benchmarks.default_model_layouts', *sys.argv[1:]])}`)",
             "",
             f"| layout | ranks | score |{' per seed set |' if pooled else ''} verdicts vs serial: lost / gained "
             "| max abs diff vs serial | PSNR vs serial | s / image |",
             f"|---|---|---|{'---|' if pooled else ''}---|---|---|---|"]
    for n, w, s, per_set, lost, gained, d, p, t in rows:
        sets = f" {' / '.join(f'{x:.1f}%' for x in per_set)} |" if pooled else ""
        lines.append(f"| {n} | {w} | {s:.1f}% |{sets} {lost} / {gained} | {d:.1e} | {p:.1f} dB | {t:.2f} |")
    with open(out, "w") as f:
        f.write("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
