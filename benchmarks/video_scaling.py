"""How one denoising step's time grows with video tokens on 2 ranks: `python -m benchmarks.video_scaling`.

A Wan-shaped transformer (WanTransformer3DModel, 4 heads x 64, 4 blocks, ~6 M parameters, fp32) on video
latents of 1..F latent frames x 16 x 16 tokens (256 x 256 px frames): per token count, one transformer
forward (one denoising step without CFG) serially on rank 0, the same serial work on both ranks at once
(the machine's ceiling: the best a 2-rank method can do here), and meshdit's ulysses 2 and ring 2 (and
diffusers' own context parallelism through Wan's `_cp_plan`, where it runs), 2 ranks x 1 thread, interleaved
rounds, medians. Every parallel output is checked against the serial one. Writes
benchmarks/results/video_scaling.{md,json,png}.
"""
from __future__ import annotations

import argparse
import copy
import json
import statistics
import time
import warnings
from pathlib import Path

import torch
import torch.distributed as dist

LATENT_FRAMES = (1, 2, 4, 8, 16)  # x 16 x 16 tokens each: 256 .. 4096 tokens
TOKEN_SIDE = 16  # tokens per side of a frame: 32 x 32 latents with Wan's 2 x 2 patches
TEXT_TOKENS = 64
METHODS = {"ulysses2": dict(ulysses_degree=2), "ring2": dict(ring_degree=2)}
_SETUP: dict = {}


def wan_pipeline(seed: int = 0, quick: bool = False):
    """WanPipeline around the benchmark transformer (tiny VAE and text encoder: the forward is what is timed; the
    3-channel VAE the planner's memory check was calibrated on, not compared against serial)."""
    from diffusers import FlowMatchEulerDiscreteScheduler, WanPipeline, WanTransformer3DModel

    from meshdit.models.tiny.wan import tiny_wan_vae, umt5_text_model
    from meshdit.testing.tiny_models import t5_tokenizer

    torch.manual_seed(seed)
    heads, head_dim, layers = (2, 16, 1) if quick else (4, 64, 4)
    transformer = WanTransformer3DModel(
        patch_size=(1, 2, 2), num_attention_heads=heads, attention_head_dim=head_dim, in_channels=16,
        out_channels=16, text_dim=64, freq_dim=64, ffn_dim=4 * heads * head_dim, num_layers=layers,
        cross_attn_norm=True, qk_norm="rms_norm_across_heads", rope_max_seq_len=64).eval()
    return WanPipeline(tokenizer=t5_tokenizer(), text_encoder=umt5_text_model(64), vae=tiny_wan_vae(base_dim=3),
                       scheduler=FlowMatchEulerDiscreteScheduler(shift=5.0), transformer=transformer)


def _setup(quick: bool) -> dict:
    """Per rank, once: the serial transformer, a meshdit engine per method, diffusers' CP transformers."""
    from diffusers import WanPipeline

    from meshdit.config import ParallelConfig
    from meshdit.engine import Engine
    from meshdit.testing.rank_pool import mesh_for

    from .diffusers_cp import enable_context_parallel

    if "serial" not in _SETUP:
        base = wan_pipeline(quick=quick)
        _SETUP["serial"] = base.transformer
        _SETUP["skipped"] = {}
        for name, degrees in METHODS.items():
            pipe = WanPipeline(**{**base.components, "transformer": copy.deepcopy(base.transformer)})
            _SETUP[f"{name}/meshdit"] = Engine(pipe, mesh_for(ParallelConfig(**degrees))).pipe.transformer
            try:  # NOTE: every rank tries the same thing, so all ranks skip alike
                transformer = copy.deepcopy(base.transformer)
                enable_context_parallel(transformer, **degrees)
                _SETUP[f"{name}/diffusers"] = transformer
            except Exception as exc:  # noqa: BLE001 - reported as the row's note
                _SETUP["skipped"][f"{name}/diffusers"] = f"{type(exc).__name__}: {exc}"[:200]
    return _SETUP


def scaling_job(frames: int, rounds: int, quick: bool) -> dict:
    """Rank side: times of every configuration at `frames` latent frames (the slower rank's, per round)."""
    warnings.filterwarnings("ignore")
    setup = _setup(quick)
    rank = dist.get_rank()
    torch.manual_seed(1)
    inputs = dict(hidden_states=torch.randn(1, 16, frames, 2 * TOKEN_SIDE, 2 * TOKEN_SIDE),  # [B, C, F, h, w]
                  timestep=torch.tensor([500.0]), encoder_hidden_states=torch.randn(1, TEXT_TOKENS, 64),
                  return_dict=False)
    entries = {"serial": (setup["serial"], (0,)), "ceiling": (setup["serial"], (0, 1))}
    entries.update({label: (module, (0, 1)) for label, module in setup.items()
                    if "/" in label and label not in setup["skipped"]})

    def forward(module):
        with torch.inference_mode():
            return module(**inputs)[0]

    reference = forward(setup["serial"])
    diffs = {label: float((forward(m) - reference).abs().max() / reference.abs().max())
             for label, (m, _) in entries.items() if "/" in label}
    times: dict[str, list[float]] = {label: [] for label in entries}
    labels = list(entries)
    for r in range(rounds):
        for label in labels[r % len(labels):] + labels[:r % len(labels)]:
            module, ranks = entries[label]
            dist.barrier()
            start = time.perf_counter()
            if rank in ranks:
                forward(module)
            seconds = torch.tensor([time.perf_counter() - start if rank in ranks else 0.0], dtype=torch.float64)
            dist.all_reduce(seconds, op=dist.ReduceOp.MAX)
            times[label].append(float(seconds))
    return {"times": times, "relative_diff": diffs, "skipped": setup["skipped"]}


def summarize(frames: int, result: dict) -> dict:
    med = {label: statistics.median(ts) for label, ts in result["times"].items()}
    ceiling = 2 * med["serial"] / med["ceiling"]  # throughput of 2 independent serial runs over one
    row = {"latent_frames": frames, "num_frames": 4 * (frames - 1) + 1, "tokens": frames * TOKEN_SIDE ** 2,
           "serial_s": med["serial"], "ceiling": ceiling, "ceiling_s": med["serial"] / ceiling, "methods": {}}
    for label, seconds in med.items():
        if "/" in label:
            speedup = med["serial"] / seconds
            row["methods"][label] = {"seconds": seconds, "speedup": speedup, "efficiency": speedup / ceiling,
                                     "relative_diff": result["relative_diff"][label]}
    return row


COLORS = {"serial": (90, 90, 90), "ceiling": (0, 0, 0), "ulysses2/meshdit": (31, 119, 180),
          "ring2/meshdit": (214, 39, 40), "ulysses2/diffusers": (140, 190, 230), "ring2/diffusers": (240, 150, 150)}


def write_png(rows: list[dict], meta: dict, path: Path) -> None:
    """Seconds per step against tokens, both axes log2: serial, the 2-rank ceiling, each method."""
    import math

    from PIL import Image, ImageDraw

    from .report import chart_fonts

    series = {"serial": [r["serial_s"] for r in rows], "ceiling": [r["ceiling_s"] for r in rows]}
    for label in rows[0]["methods"]:
        series[label] = [r["methods"][label]["seconds"] for r in rows]
    tokens = [r["tokens"] for r in rows]
    width, height, left, right, top, bottom = 820, 480, 70, 250, 60, 60
    img = Image.new("RGB", (width, height), "white")
    draw = ImageDraw.Draw(img)
    font, small = chart_fonts(15)
    draw.text((left, 10), "Video tokens: seconds per denoising step, 2 ranks x 1 thread vs 1 x 1", fill="black",
              font=font)
    draw.text((left, 32), f"{meta['model']}; {meta['date_utc']}; load average at start {meta['load_average_start']}",
              fill=(90, 90, 90), font=small)
    lo = math.log2(min(min(v) for v in series.values())) - 0.2
    hi = math.log2(max(max(v) for v in series.values())) + 0.2
    plot_w, plot_h = width - left - right, height - top - bottom

    def xy(t, s):
        fx = (math.log2(t) - math.log2(tokens[0])) / max(1e-9, math.log2(tokens[-1]) - math.log2(tokens[0]))
        return left + fx * plot_w, top + plot_h - plot_h * (math.log2(s) - lo) / (hi - lo)

    draw.line([(left, top), (left, top + plot_h), (left + plot_w, top + plot_h)], fill="black")
    for t in tokens:
        x, _ = xy(t, 2 ** lo)
        draw.text((x - 12, top + plot_h + 6), str(t), fill="black", font=small)
    draw.text((left + plot_w / 2 - 60, height - 28), "video tokens (F' x 16 x 16)", fill="black", font=small)
    for e in range(math.ceil(lo), math.floor(hi) + 1):
        _, y = xy(tokens[0], 2.0 ** e)
        draw.line([(left - 4, y), (left, y)], fill="black")
        draw.text((left - 58, y - 7), f"{2.0 ** e:.3g} s", fill="black", font=small)
    for i, (label, values) in enumerate(series.items()):
        points = [xy(t, s) for t, s in zip(tokens, values)]
        draw.line(points, fill=COLORS.get(label, (0, 150, 0)), width=3 if label == "ceiling" else 2)
        for x, y in points:
            draw.ellipse([x - 3, y - 3, x + 3, y + 3], fill=COLORS.get(label, (0, 150, 0)))
        ly = top + 10 + 22 * i
        draw.line([(left + plot_w + 15, ly + 7), (left + plot_w + 40, ly + 7)], fill=COLORS.get(label, (0, 150, 0)),
                  width=3)
        name = "ceiling (best any 2 ranks do)" if label == "ceiling" else label
        draw.text((left + plot_w + 45, ly), name, fill="black", font=small)
    img.save(path)


def write_markdown(rows: list[dict], meta: dict, skipped: dict) -> str:
    labels = list(rows[0]["methods"])
    lines = ["# Video tokens on 2 ranks (`python -m benchmarks.video_scaling`)", "",
             f"{meta['model']}; {meta['rounds']} interleaved rounds, medians; {meta['date_utc']}; "
             f"load average at start {meta['load_average_start']}, at end {meta['load_average_end']}.", "",
             "| latent frames (frames) | tokens | serial s/step | ceiling | "
             + " | ".join(f"{label} speedup (efficiency)" for label in labels) + " | max rel. diff |",
             "|---" * (5 + len(labels)) + "|"]
    for r in rows:
        cells = [f"{r['methods'][k]['speedup']:.2f}x ({r['methods'][k]['efficiency']:.2f})" for k in labels]
        diff = max(m["relative_diff"] for m in r["methods"].values())
        lines.append(f"| {r['latent_frames']} ({r['num_frames']}) | {r['tokens']} | {r['serial_s']:.3f} | "
                     f"{r['ceiling']:.2f}x | " + " | ".join(cells) + f" | {diff:.1e} |")
    lines += ["", "Speedup = serial time / method time; ceiling = the same serial work on both ranks at once "
              "(throughput over one rank); efficiency = speedup / ceiling."]
    lines += [f"- {label} not run: {why}" for label, why in skipped.items()]
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    import datetime
    import os

    from meshdit.testing.rank_pool import RankPool

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="a tiny transformer, 2 token counts, 2 rounds (the test)")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--out", type=Path, default=Path("benchmarks/results"))
    args = ap.parse_args(argv)
    frames = LATENT_FRAMES[:2] if args.quick else LATENT_FRAMES
    rounds = 2 if args.quick else args.rounds
    meta = {"model": "Wan-shaped transformer, " + ("2 heads x 16, 1 block" if args.quick else
                                                    "4 heads x 64, 4 blocks, ~6 M parameters") + ", fp32",
            "rounds": rounds, "date_utc": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M"),
            "load_average_start": round(os.getloadavg()[0], 2)}
    pool = RankPool(2)
    rows, skipped = [], {}
    try:
        for f in frames:
            result = pool.run(scaling_job, f, rounds, args.quick, timeout=1800)[0]
            skipped = result["skipped"]
            rows.append(summarize(f, result))
            r = rows[-1]
            print(f"{r['tokens']:5d} tokens: serial {r['serial_s']:.3f} s, ceiling {r['ceiling']:.2f}x, "
                  + ", ".join(f"{k} {m['speedup']:.2f}x" for k, m in r["methods"].items()), flush=True)
    finally:
        pool.close()
    meta["load_average_end"] = round(os.getloadavg()[0], 2)
    args.out.mkdir(parents=True, exist_ok=True)
    stem = "video_scaling_quick" if args.quick else "video_scaling"
    (args.out / f"{stem}.json").write_text(json.dumps({"meta": meta, "rows": rows, "skipped": skipped}, indent=1))
    (args.out / f"{stem}.md").write_text(write_markdown(rows, meta, skipped))
    write_png(rows, meta, args.out / f"{stem}.png")
    print(f"wrote {args.out / stem}.{{json,md,png}}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
