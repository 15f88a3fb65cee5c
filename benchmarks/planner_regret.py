"""Regret of the planner's choice (issue 46 item 4), on CPU ranks here: for each cell (image tokens, CFG on or off,
ranks) every legal layout of the benchmark model (benchmarks/models.py) is measured, and the planner's pick
(`--layout auto`'s: exact layouts, no FP8) is compared with the measured best; predicted and measured time of each
layout side by side. Times: the median of --rounds generates after a warm one, on the output rank.

    python -m benchmarks.planner_regret [--tokens 256 1024] [--ranks 2] [--steps 3] [--rounds 3]
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time


def _rank_job(payload) -> None:
    import torch.distributed as dist

    from meshdit.rank import start_rank

    settings, request, rounds, out = payload
    ranked = start_rank(settings)
    ranked.engine.generate(request)  # warm
    times = []
    for _ in range(rounds):
        dist.barrier()
        start = time.perf_counter()
        ranked.engine.generate(request)
        times.append(time.perf_counter() - start)
    if dist.get_rank() == 0:
        with open(out, "w", encoding="utf-8") as f:
            json.dump(times, f)


def measure(settings, request, rounds: int) -> float:
    from meshdit.distributed.launch import launch

    fd, out = tempfile.mkstemp(prefix="meshdit-regret-", suffix=".json")
    os.close(fd)
    try:
        launch(_rank_job, (settings, request, rounds, out), settings.config.world_size)
        with open(out, encoding="utf-8") as f:
            return statistics.median(json.load(f))
    finally:
        os.unlink(out)


def cell(folder: str, tokens: int, cfg: bool, ranks: int, steps: int, rounds: int) -> dict:
    from benchmarks.models import pixels_for_tokens
    from meshdit.config import GenerateRequest
    from meshdit.engine_settings import EngineSettings
    from meshdit.planner.choose import load_model, make_plan
    from meshdit.planner.hardware import world_from
    from meshdit.vae.settings import VaeDecodeSettings

    px = pixels_for_tokens(tokens)
    request = GenerateRequest(prompt="a red circle", height=px, width=px, num_inference_steps=steps, seed=0,
                              guidance_scale=3.0 if cfg else 1.0, warmup_steps=1, extra={"max_sequence_length": 32})
    _, info, costs = load_model(folder)
    plan = make_plan(info, costs, request, world_from("cpu-here", ranks, 1), fp8_options=False)
    rows = [r for r in plan.rows if r.fits and not r.layout.text_on_cpu and r.layout.vae != "tiled"]
    pick = plan.recommended  # what --layout auto runs
    measured = {}
    for r in rows:
        settings = EngineSettings(folder, r.layout.parallel_config(), "float32",
                                  VaeDecodeSettings(parallel=r.layout.vae == "parallel"))
        measured[r.layout.describe()] = (measure(settings, request, rounds), r.total_s, r.exact)
    exact = {k: v for k, v in measured.items() if v[2]}
    best = min(exact or measured, key=lambda k: (exact or measured)[k][0])
    chosen = pick.layout.describe()
    return {"tokens": tokens, "cfg": cfg, "ranks": ranks, "pick": chosen, "best": best,
            "regret": measured[chosen][0] / measured[best][0] - 1, "layouts": measured}


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, nargs="+", default=[256, 1024])
    parser.add_argument("--ranks", type=int, nargs="+", default=[2])
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args(argv)
    from benchmarks.models import FULL, flux_pipeline

    print("| tokens | CFG | ranks | planner's pick | measured best (exact) | regret | layouts: measured s / predicted s |")
    print("|---|---|---|---|---|---|---|")
    with tempfile.TemporaryDirectory(prefix="meshdit-benchmark-model-") as folder:
        flux_pipeline(FULL).save_pretrained(folder)
        for ranks in args.ranks:
            for tokens in args.tokens:
                for cfg in (False, True):
                    c = cell(folder, tokens, cfg, ranks, args.steps, args.rounds)
                    layouts = "; ".join(f"{k} {m:.2f} / {p:.2f}" + ("" if e else " (approx.)")
                                        for k, (m, p, e) in sorted(c["layouts"].items(), key=lambda kv: kv[1][0]))
                    print(f"| {tokens} | {'on' if cfg else 'off'} | {ranks} | {c['pick']} | {c['best']} | "
                          f"{c['regret'] * 100:.1f}% | {layouts} |", flush=True)


if __name__ == "__main__":
    main()
