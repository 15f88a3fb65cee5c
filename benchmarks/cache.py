"""Step caching: steps computed / total, end-to-end speed-up over uncached in the same run, PSNR vs uncached.

    python -m benchmarks.cache                                  # every model below, serial and ulysses 2
    python -m benchmarks.cache --models bundled --layouts serial --score 56
    python -m benchmarks.cache --models benchmark-28 benchmark-50 --tokens 4096

Branch-steps: one per guidance branch and step (the bundled model's true CFG runs two transformer calls per
step, each deciding for itself). The speed-up in CPU time (the slowest rank's process time) is the one to read on
a shared machine: wall-clock time there moves with the other processes' load.

Models: the benchmark model (benchmarks/models.py FULL, Flux-shaped random weights, no CFG) at 28 and 50 steps
and `--tokens` image tokens; meshdit's bundled model at its own size, steps and guidance. Per model and layout,
one job on a pool of gloo ranks generates uncached, then each cache setting, then uncached again (the speed-up
divides the faster uncached run by the cached run: the machine's load drifts); PSNR of the image against the
uncached image of the same layout. --score N also scores the bundled model's first N held-out prompts
(default_model.evaluate) uncached and with each setting, serially. Writes benchmarks/results/cache.md and its rows
as JSON beside it (cache.json; benchmarks/cache_chart.py draws them).
"""
from __future__ import annotations

import argparse
import json
import shlex
import sys
import time

import numpy as np

# label -> CacheSettings fields (None: uncached). The presets are meshdit/cache_settings.py's (fast: fbcache 0.6).
SETTINGS = {
    "fast (preset)": dict(method="fast"),
    "fbcache (preset)": dict(method="fbcache"),
    "fbcache 0.2": dict(method="fbcache", threshold=0.2),
    "dbcache (preset)": dict(method="dbcache"),
    "dbcache + taylorseer 1": dict(method="dbcache", taylorseer=1),
}
MODELS = {"benchmark-28": ("benchmark", 28), "benchmark-50": ("benchmark", 50), "bundled": ("bundled", None)}
LAYOUTS = {"serial": {}, "ulysses 2": dict(ulysses_degree=2)}


def _pipeline_and_request(model: str, steps: int | None, tokens: int):
    from dataclasses import replace

    from meshdit.config import GenerateRequest

    if model == "benchmark":
        from benchmarks.jobs import _request
        from benchmarks.models import FULL, flux_pipeline

        return flux_pipeline(FULL), _request(tokens, 16, steps, cfg=False)
    from diffusers import FluxPipeline

    from meshdit import default_model as dm

    pipe = FluxPipeline.from_pretrained(dm.weights_path())
    pipe.set_progress_bar_config(disable=True)
    request = GenerateRequest(prompt="two red circles on a white background", negative_prompt=dm.DEFAULT_NEGATIVE_PROMPT,
                              height=dm.DEFAULT_HEIGHT, width=dm.DEFAULT_WIDTH, num_inference_steps=dm.DEFAULT_STEPS,
                              guidance_scale=dm.DEFAULT_GUIDANCE, seed=0,
                              extra={"max_sequence_length": dm.DEFAULT_MAX_SEQUENCE_LENGTH})
    return pipe, (replace(request, num_inference_steps=steps) if steps else request)


def run(model: str, steps: int | None, tokens: int, degrees: dict, labels: list[str], rounds: int = 1) -> dict:
    """On every rank: seconds (slowest rank; the least over `rounds` rounds), images and steps computed per label
    ("uncached" twice per round)."""
    from dataclasses import replace

    import torch
    import torch.distributed as dist

    from meshdit.cache import CacheSettings
    from meshdit.config import ParallelConfig
    from meshdit.engine import Engine
    from meshdit.testing.rank_pool import mesh_for

    torch.set_num_threads(1)
    config = ParallelConfig(**degrees)
    pipe, request = _pipeline_and_request(model, steps, tokens)
    engine = Engine(pipe, mesh_for(config) if config.world_size > 1 else None)
    out = {"seconds": {}, "cpu": {}, "images": {}, "computed": {}, "steps": request.num_inference_steps}
    try:
        engine.generate(replace(request, num_inference_steps=1))  # first-call costs out of the timings
        for label in ["uncached", *labels, "uncached again"] * rounds:
            cache = CacheSettings(**SETTINGS[label]) if label in SETTINGS else CacheSettings()
            start, cpu = time.perf_counter(), time.process_time()
            result = engine.generate(replace(request, cache=cache))
            seconds = torch.tensor([time.perf_counter() - start, time.process_time() - cpu], dtype=torch.float64)
            if dist.is_initialized():
                dist.all_reduce(seconds, op=dist.ReduceOp.MAX)
            wall, cpu = seconds.tolist()
            out["seconds"][label] = min(wall, out["seconds"].get(label, wall))
            out["cpu"][label] = min(cpu, out["cpu"].get(label, cpu))
            out["images"][label] = result.images
            out["computed"][label] = (result.cache.computed_calls() if result.cache is not None else None)
    finally:
        engine.close()
    return out


def psnr(a, b) -> float:
    mse = float(((a - b) ** 2).mean())
    return float("inf") if mse == 0 else 10 * np.log10(1.0 / mse)


def score(labels: list[str], limit: int) -> dict:
    """Bundled model, serial: held-out prompt score (%) and PSNR vs uncached per label."""
    from benchmarks.default_model_layouts import generate_all
    from default_model import dataset
    from default_model.evaluate import score_image
    from meshdit.cache import CacheSettings

    prompts = list(dataset.EVAL_PROMPTS[:limit])
    out, reference = {}, None
    for label in ["uncached", *labels]:
        cache = CacheSettings(**SETTINGS[label]) if label in SETTINGS else CacheSettings()
        images, _ = generate_all(dict(cache=cache), prompts, 0)
        reference = images if reference is None else reference
        out[label] = (100.0 * np.mean([score_image(i, p) for i, p in zip(images, prompts)]), psnr(images, reference))
        print(f"score {label}: {out[label][0]:.1f}%  PSNR {out[label][1]:.1f} dB", flush=True)
    return out


def main() -> None:
    from meshdit.config import ParallelConfig
    from meshdit.testing.rank_pool import close_all_pools, get_pool

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", nargs="*", default=list(MODELS), choices=list(MODELS),
                        help="none with --score: only the score")
    parser.add_argument("--layouts", nargs="+", default=list(LAYOUTS), choices=list(LAYOUTS))
    parser.add_argument("--settings", nargs="+", default=list(SETTINGS), choices=list(SETTINGS))
    parser.add_argument("--tokens", type=int, default=4096, help="benchmark model's image tokens (a square)")
    parser.add_argument("--rounds", type=int, default=1,
                        help="run the whole sequence N times and keep each setting's least time (default: 1)")
    parser.add_argument("--score", type=int, default=0, metavar="N",
                        help="also score the bundled model's first N held-out prompts (default: 0, off)")
    parser.add_argument("--out", default="benchmarks/results/cache.md")
    args = parser.parse_args()
    lines = [f"`{shlex.join(['python', '-m', 'benchmarks.cache', *sys.argv[1:]])}`", "",
             "| model | steps | layout | cache | branch-steps computed / total | seconds (CPU s) | speed-up wall "
             "| speed-up CPU time | PSNR vs uncached |",
             "|---|---|---|---|---|---|---|---|---|"]
    records = {"command": lines[0].strip("`"), "rows": [], "score": []}
    try:
        for name in args.models:
            model, steps = MODELS[name]
            for layout in args.layouts:
                degrees = LAYOUTS[layout]
                world = ParallelConfig(**degrees).world_size
                job = (model, steps, args.tokens, degrees, args.settings, args.rounds)
                result = get_pool(world).run(run, *job, timeout=7200)[0] if world > 1 else run(*job)
                base = min(result["seconds"]["uncached"], result["seconds"]["uncached again"])
                base_cpu = min(result["cpu"]["uncached"], result["cpu"]["uncached again"])
                what = f"{name} ({args.tokens} tokens)" if model == "benchmark" else name
                total = next((c[1] for c in result["computed"].values() if c), None)
                for label in ["uncached", *args.settings]:
                    seconds, cpu = result["seconds"][label], result["cpu"][label]
                    computed = result["computed"][label] or (total, total)
                    row = (f"| {what} | {result['steps']} | {layout} | {label} | {computed[0]} / {computed[1]} | "
                           f"{seconds:.1f} ({cpu:.1f}) | {base / seconds:.2f}x | {base_cpu / cpu:.2f}x | "
                           f"{psnr(result['images'][label], result['images']['uncached']):.1f} dB |")
                    print(row, flush=True)
                    lines.append(row)
                    records["rows"].append(dict(
                        model=name, tokens=args.tokens if model == "benchmark" else None, steps=result["steps"],
                        layout=layout, cache=label, computed=computed[0], total=computed[1], wall_s=seconds,
                        cpu_s=cpu, speedup_wall=base / seconds, speedup_cpu=base_cpu / cpu,
                        psnr_db=psnr(result["images"][label], result["images"]["uncached"])))
    finally:
        close_all_pools()
    if args.score:
        lines += ["", f"Bundled model, serial, first {args.score} held-out prompts, seeds 0..{args.score - 1}:", "",
                  "| cache | score | PSNR vs uncached |", "|---|---|---|"]
        for label, (value, db) in score(args.settings, args.score).items():
            lines.append(f"| {label} | {value:.1f}% | {db:.1f} dB |")
            records["score"].append(dict(cache=label, prompts=args.score, score=value, psnr_db=db))
    with open(args.out, "w") as f:
        f.write("\n".join(lines) + "\n")
    with open(args.out.rsplit(".", 1)[0] + ".json", "w") as f:
        json.dump(records, f, indent=1, default=float)
    print("\n".join(lines))


if __name__ == "__main__":
    main()
