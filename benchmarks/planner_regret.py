"""Regret of the planner's choice (issue 46 item 4), on CPU ranks here: for each cell (model, tokens, CFG on or off,
ranks) every legal exact-capable layout is measured — each degree assignment with a plain decode and, where its
image group has more than one rank, a parallel one — and the planner's pick (`--layout auto`'s: no FP8, no tiled
decode) is compared with the measured best exact layout; predicted and measured time of each layout side by side.
Times: the median of --rounds generates after a warm one (one step), on rank 0, after a barrier.

    python -m benchmarks.planner_regret [--models benchmark wan] [--tokens 256 1024 4096] [--ranks 2 4]
                                        [--steps 3] [--rounds 3] [--json benchmarks/results/planner_regret.json]
    python -m benchmarks.planner_regret --report FILE.json [FILE.json ...] [--compact]   # saved runs' table

benchmark: the Flux-shaped benchmark model (benchmarks/models.py) at --tokens image tokens; wan: the Wan-shaped
video model of benchmarks/video_scaling.py at --video-tokens (256 a latent frame). Calibrate first
(`meshdit plan --calibrate`): the cpu-here preset reads its figures. Run it on an idle machine: the times of
oversubscribed ranks are those of whatever else runs.
"""
from __future__ import annotations

import argparse
import json
import os
import tempfile
from dataclasses import replace

TARGET_REGRET = 0.05
TARGET_PREDICTION = 0.25


def _rank_job(payload) -> None:
    import torch.distributed as dist

    from meshdit.planner.calibrate import median_generate_seconds
    from meshdit.rank import start_rank
    from meshdit.vae.settings import VaeDecodeSettings

    settings, request, modes, rounds, out = payload
    ranked = start_rank(settings)
    engine = ranked.engine
    times = {}
    for mode in modes:  # the ranks loaded the VAE for a parallel decode when it is measured: a plain one needs less
        engine.vae = VaeDecodeSettings(parallel=mode == "parallel")
        engine.generate(replace(request, num_inference_steps=1))  # warm: same shapes, first-call costs
        times[mode] = median_generate_seconds(engine, request, rounds)
    if dist.get_rank() == 0:
        with open(out, "w", encoding="utf-8") as f:
            json.dump(times, f)


def measure(settings, request, modes: tuple[str, ...], rounds: int) -> dict[str, float]:
    """{decode mode: median seconds of a generate} for one degree assignment, in one launch of its ranks."""
    from meshdit.distributed.launch import launch

    fd, out = tempfile.mkstemp(prefix="meshdit-regret-", suffix=".json")
    os.close(fd)
    try:
        launch(_rank_job, (settings, request, modes, rounds, out), settings.config.world_size)
        with open(out, encoding="utf-8") as f:
            return json.load(f)
    finally:
        os.unlink(out)


def _request(model: str, tokens: int, cfg: bool, steps: int):
    from benchmarks.models import pixels_for_tokens
    from benchmarks.video_scaling import TOKEN_SIDE
    from meshdit.config import GenerateRequest

    common = dict(prompt="a red circle", num_inference_steps=steps, seed=0, guidance_scale=3.0 if cfg else 1.0,
                  warmup_steps=1, extra={"max_sequence_length": 32})
    if model == "wan":
        frames = 4 * (max(1, tokens // TOKEN_SIDE ** 2) - 1) + 1
        return GenerateRequest(height=256, width=256, num_frames=frames, **common)
    px = pixels_for_tokens(tokens)
    return GenerateRequest(height=px, width=px, **common)


def cell(folder: str, model: str, tokens: int, cfg: bool, ranks: int, steps: int, rounds: int) -> dict:
    from meshdit.engine_settings import EngineSettings
    from meshdit.planner.choose import load_model, make_plan
    from meshdit.planner.hardware import world_from
    from meshdit.planner.layouts import legal_layouts
    from meshdit.planner.predict import predict
    from meshdit.request import fill_defaults
    from meshdit.vae.settings import VaeDecodeSettings

    request = _request(model, tokens, cfg, steps)
    _, info, costs = load_model(folder)
    world = world_from("cpu-here", ranks, 1)
    plan = make_plan(info, costs, request, world, fp8_options=False)
    full = fill_defaults(request, info.request_defaults())
    rows = [predict(layout, costs, world, full) for layout in legal_layouts(info, full, ranks, fp8_options=False,
                                                                             parallel_vae=costs.vae_splits)]
    by_degrees: dict = {}
    for r in rows:
        if r.fits:
            by_degrees.setdefault(r.layout.degrees, []).append(r)
    layouts = {}
    for degrees, variants in by_degrees.items():
        modes = tuple(sorted({v.layout.vae for v in variants}, reverse=True))  # parallel first: it loads the VAE
        settings = EngineSettings(folder, variants[0].layout.parallel_config(), "float32",
                                  VaeDecodeSettings(parallel="parallel" in modes))
        times = measure(settings, request, modes, rounds)
        for v in variants:
            layouts[f"{v.layout.describe()}, {v.layout.vae} decode"] = {
                "measured_s": times[v.layout.vae], "predicted_s": v.total_s, "exact": v.exact}
    exact = {k: v for k, v in layouts.items() if v["exact"]}
    best = min(exact, key=lambda k: exact[k]["measured_s"])
    pick = f"{plan.recommended.layout.describe()}, {plan.recommended.layout.vae} decode"
    return {"model": model, "tokens": tokens, "cfg": cfg, "ranks": ranks, "pick": pick, "best": best,
            "regret": layouts[pick]["measured_s"] / layouts[best]["measured_s"] - 1, "layouts": layouts}


def summary(cells: list[dict]) -> dict:
    """Cells within TARGET_REGRET of the best, layouts predicted within TARGET_PREDICTION (in all and per model,
    with the range of predicted / measured), the worst cell."""
    ratios = {c["model"]: [] for c in cells}
    for c in cells:
        ratios[c["model"]] += [v["predicted_s"] / v["measured_s"] for v in c["layouts"].values()]
    worst_cell = max(cells, key=lambda c: c["regret"])
    per_model = {model: {"predicted_within": sum(abs(r - 1) <= TARGET_PREDICTION for r in rs), "layouts": len(rs),
                         "ratio_range": (min(rs), max(rs))} for model, rs in ratios.items()}
    return {"cells_within": sum(c["regret"] <= TARGET_REGRET for c in cells), "cells": len(cells),
            "predicted_within": sum(m["predicted_within"] for m in per_model.values()),
            "layouts": sum(m["layouts"] for m in per_model.values()), "per_model": per_model,
            "worst_regret": worst_cell["regret"], "worst_cell": {k: worst_cell[k] for k in
                                                                  ("model", "tokens", "cfg", "ranks", "pick", "best")}}


def _load(path: str) -> list[dict]:
    with open(path, encoding="utf-8") as f:
        return json.load(f)["cells"]


def _print_header(compact: bool = False) -> None:
    print("| model | tokens | CFG | ranks | planner's pick | measured best (exact) | regret |" +
          ("" if compact else " layouts: measured s / predicted s |"))
    print("|---|---|---|---|---|---|---|" + ("" if compact else "---|"))


def _print_summary(result: dict) -> None:
    print(f"\n{result['cells_within']} of {result['cells']} cells within {TARGET_REGRET:.0%} of the measured best; "
          f"{result['predicted_within']} of {result['layouts']} layouts' predicted time within "
          f"{TARGET_PREDICTION:.0%}; worst cell {result['worst_regret'] * 100:.1f}% ({result['worst_cell']})")
    for model, m in result["per_model"].items():
        low, high = m["ratio_range"]
        print(f"{model}: {m['predicted_within']} of {m['layouts']} layouts within {TARGET_PREDICTION:.0%}, "
              f"predicted / measured {low:.2f}-{high:.2f}x")


def _print_row(c: dict, compact: bool = False) -> None:
    """compact: the pick and the best with their measured / predicted seconds, no other layout."""
    if compact:
        pick, best = (f"{k} ({c['layouts'][k]['measured_s']:.2f} / {c['layouts'][k]['predicted_s']:.2f} s)"
                      for k in (c["pick"], c["best"]))
        print(f"| {c['model']} | {c['tokens']} | {'on' if c['cfg'] else 'off'} | {c['ranks']} | {pick} | "
              f"{best if c['best'] != c['pick'] else 'the same'} | {c['regret'] * 100:.1f}% |", flush=True)
        return
    layouts = "; ".join(f"{k} {v['measured_s']:.2f} / {v['predicted_s']:.2f}"
                        for k, v in sorted(c["layouts"].items(), key=lambda kv: kv[1]["measured_s"]))
    print(f"| {c['model']} | {c['tokens']} | {'on' if c['cfg'] else 'off'} | {c['ranks']} | {c['pick']} | "
          f"{c['best']} | {c['regret'] * 100:.1f}% | {layouts} |", flush=True)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", default=["benchmark", "wan"], choices=["benchmark", "wan"])
    parser.add_argument("--tokens", type=int, nargs="+", default=[256, 1024, 4096])
    parser.add_argument("--video-tokens", type=int, nargs="+", default=[1024])
    parser.add_argument("--ranks", type=int, nargs="+", default=[2, 4])
    parser.add_argument("--cfg", choices=["both", "on", "off"], default="both")
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--json", default=None, help="also write the cells and the summary here")
    parser.add_argument("--report", nargs="+", default=None, metavar="FILE",
                        help="print the table and summary of saved --json runs together, measuring nothing")
    parser.add_argument("--compact", action="store_true", help="with --report: without the per-layout times "
                        "(the README's table)")
    args = parser.parse_args(argv)
    if args.report:
        cells = [c for path in args.report for c in _load(path)]
        _print_header(args.compact)
        for c in cells:
            _print_row(c, args.compact)
        _print_summary(summary(cells))
        return
    from benchmarks.models import FULL, flux_pipeline
    from benchmarks.video_scaling import wan_pipeline

    builders = {"benchmark": lambda: flux_pipeline(FULL), "wan": wan_pipeline}
    cfgs = {"both": (False, True), "on": (True,), "off": (False,)}[args.cfg]
    _print_header()
    cells = []
    for model in args.models:
        with tempfile.TemporaryDirectory(prefix="meshdit-benchmark-model-") as folder:
            builders[model]().save_pretrained(folder)
            for ranks in args.ranks:
                for tokens in (args.tokens if model == "benchmark" else args.video_tokens):
                    for cfg in cfgs:
                        cells.append(cell(folder, model, tokens, cfg, ranks, args.steps, args.rounds))
                        _print_row(cells[-1])
    result = summary(cells)
    _print_summary(result)
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump({"cells": cells, "summary": result}, f, indent=1)


if __name__ == "__main__":
    main()
