"""Side-by-side benchmark runner: `python -m benchmarks.run [--quick] [--out benchmarks/results]`.

Parts can be re-run alone, e.g. `python -m benchmarks.run --methods pipefusion2 cfg2 --tokens 4096 --rounds 5
--out /tmp/bench` (the overhead section always runs; it is short).

One run measures, on this machine and in one sitting:
  1. overhead   meshdit (all degrees 1) vs the plain diffusers pipeline, interleaved, same image
  2. scaling    2 ranks x 1 thread vs 1 rank x 1 thread, meshdit and diffusers' own context parallelism,
                each against the ceiling (the serial work in 2 processes at once, no communication)
  3. communication  bytes per rank per denoising step, counted at the collectives, vs the formula
  4. memory     parameter bytes and peak activation bytes per rank
  5. gpu        the overhead comparison at FLUX.1-dev size, where a GPU exists
and writes latest.json, latest.md and latest.png under --out.
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import statistics
import subprocess
import sys
import time
import warnings
from pathlib import Path

import torch

from .methods import METHODS, Shape, method
from .models import FULL, LATENT_CHANNELS, QUICK

RANKS = 2
BYTES_TOLERANCE = 0.10


def settings(quick: bool) -> dict:
    if quick:  # tiny sizes: the test runs this
        return dict(size="quick", model=QUICK, tokens=[64, 256], text_tokens=8, rounds=2,
                    overhead=dict(image_tokens=64, text_tokens=8, steps=2, pairs=2))
    return dict(size="full", model=FULL, tokens=[1024, 4096], text_tokens=64, rounds=7,
                overhead=dict(image_tokens=1024, text_tokens=64, steps=4, pairs=7))


def _shape(model, tokens: int, text_tokens: int) -> Shape:
    return Shape(image_tokens=tokens, text_tokens=text_tokens, hidden=model.hidden,
                 attention_layers=model.double_blocks + model.single_blocks, out_features=4 * LATENT_CHANNELS,
                 element_bytes=4)


def _median(xs):
    return statistics.median(xs) if xs else None


def scaling_sections(cfg: dict, log) -> tuple[dict, dict, dict]:
    from meshdit.testing.rank_pool import RankPool

    from .jobs import scaling_job

    names = cfg.get("methods") or [m.name for m in METHODS]
    scaling = {"ranks": RANKS, "threads_per_rank": 1, "unit_note": (
        "forward: one transformer call on the full inputs (split, attention, gather included); "
        "step: one denoising step through Engine.generate (its 'denoise' seconds / steps)"), "cases": [],
        "notes": {m.name: m.notes for m in METHODS if m.notes}}
    comm = {"tolerance": BYTES_TOLERANCE, "cases": [], "formulas": {m.name: m.formula_text for m in METHODS}}
    memory = {"how": (
        "param_bytes: sum of the transformer's parameter bytes on the rank. peak_activation_bytes: most bytes of "
        "tensors allocated at once during one forward (step-unit methods: one 3-step Engine.generate, text "
        "encoders and VAE included; PipeFusion: 1 warmup step and 2 patch steps, its stale K/V live), beyond what existed before it; counted by a TorchDispatchMode that adds each "
        "new tensor storage an aten op returns and subtracts it when the storage is freed (meshdit/memory.py). "
        "CPU-only, no torch.cuda."), "cases": []}
    pool = RankPool(RANKS)
    try:
        for tokens in cfg["tokens"]:
            log(f"scaling: {tokens} image tokens + {cfg['text_tokens']} text tokens, {cfg['rounds']} rounds")
            start = time.perf_counter()
            ranks = pool.run(scaling_job, cfg["size"], names, tokens, cfg["text_tokens"], cfg["rounds"], timeout=3600)
            log(f"  done in {time.perf_counter() - start:.0f} s; rank 0 phases (s): {ranks[0]['phase_seconds']}")
            r0 = ranks[0]
            med = {label: _median(ts) for label, ts in r0["times"].items()}
            case = {"image_tokens": tokens, "text_tokens": cfg["text_tokens"], "rounds": cfg["rounds"],
                    "seconds": r0["times"], "median_seconds": med, "methods": {},
                    "waiting_rank_cpu_fraction": _median(ranks[1]["waiting_rank_cpu_fraction"]),
                    "phase_seconds": ranks[0]["phase_seconds"]}
            shape = _shape(cfg["model"], tokens, cfg["text_tokens"])
            ccase = {"image_tokens": tokens, "text_tokens": cfg["text_tokens"], "methods": {}}
            mcase = {"image_tokens": tokens, "rows": {}}
            # ceiling: two ranks each doing the serial work at once, no communication; throughput vs one rank
            case["ceiling"] = {label.replace("ceiling/", "serial/"): 2 * med[label.replace("ceiling/", "serial/")]
                               / med[label] for label in r0["times"] if label.startswith("ceiling/")}
            for label in r0["times"]:
                if label.startswith(("serial/", "ceiling/")):
                    continue
                name, impl = label.split("/")
                m = method(name)
                baseline = "serial/forward" if m.unit == "forward" else f"serial/step{'-cfg' if m.cfg else ''}"
                speedup = med[baseline] / med[label]
                case["methods"].setdefault(name, {"unit": m.unit, "baseline": baseline})[impl] = {
                    "median_seconds": med[label], "speedup": speedup,
                    "efficiency": speedup / case["ceiling"][baseline],
                    "max_abs_diff_vs_serial": max(r["max_abs_diff"][label] for r in ranks)}
                measured = [sum(r["bytes"][label].values()) for r in ranks]
                ccase["methods"].setdefault(name, {})[impl] = bytes_row(m, shape, measured, r0["bytes"][label])
            for label in r0["memory"]:
                mcase["rows"][label] = [r["memory"].get(label) for r in ranks]
            case["skipped"] = r0["skipped"]
            scaling["cases"].append(case)
            comm["cases"].append(ccase)
            memory["cases"].append(mcase)
    finally:
        pool.close()
    return scaling, comm, memory


def bytes_row(m, shape: Shape, measured: list[int], by_kind: dict) -> dict:
    """Measured bytes per rank against the method's formula (one figure for every rank, or one per rank)."""
    row = {"measured_bytes_per_rank": measured, "by_kind_rank0": by_kind, "formula_bytes": None, "ratio": None,
           "within_tolerance": None}
    if m.formula:
        elements = m.formula(m.degree, shape)
        per_rank = [e * shape.element_bytes for e in (elements if isinstance(elements, list) else
                                                      [elements] * len(measured))]
        ratios = [got / want for got, want in zip(measured, per_rank)]
        row.update(formula_bytes=per_rank if isinstance(elements, list) else per_rank[0],
                   ratio=max(ratios, key=lambda x: abs(x - 1)),
                   within_tolerance=all(abs(x - 1) <= BYTES_TOLERANCE for x in ratios))
    return row


def _load_average() -> list[float]:
    return [round(x, 2) for x in os.getloadavg()]


def _git_commit() -> str:
    try:
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                              cwd=Path(__file__).parent, timeout=10).stdout.strip()
    except Exception:  # noqa: BLE001 - informative only
        return "?"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.run", description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="tiny sizes and few repeats (seconds, for tests)")
    parser.add_argument("--out", default="benchmarks/results", help="folder for latest.json/.md/.png")
    parser.add_argument("--skip-gpu", action="store_true", help="skip section 5 even where a GPU exists")
    parser.add_argument("--tokens", type=int, nargs="+", help="image token counts (default: 1024 4096; quick 64 256)")
    parser.add_argument("--rounds", type=int, help="interleaved rounds (default: 7; quick 2)")
    parser.add_argument("--methods", nargs="+", choices=[m.name for m in METHODS],
                        help="only these methods (with their baselines and ceilings), e.g. pipefusion2 cfg2")
    args = parser.parse_args(argv)
    warnings.filterwarnings("ignore")
    cfg = settings(args.quick)
    cfg.update({k: v for k, v in (("tokens", args.tokens), ("rounds", args.rounds), ("methods", args.methods)) if v})
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    began = time.perf_counter()
    load_samples = []  # (seconds into the run, 1-minute load average) at every log line

    def log(msg):
        load_samples.append((round(time.perf_counter() - began, 1), _load_average()[0]))
        print(f"[{time.perf_counter() - began:6.1f} s] {msg} (load {load_samples[-1][1]})", flush=True)

    import diffusers

    from .overhead import cpu_overhead, gpu_overhead
    from .report import write_markdown, write_png

    results = {"meta": {
        "date_utc": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "quick": args.quick, "commit": _git_commit(), "python": platform.python_version(),
        "torch": torch.__version__, "diffusers": diffusers.__version__, "cpus": os.cpu_count(),
        "load_average_start": _load_average(), "model": cfg["model"].name,
        "model_shape": {"heads": cfg["model"].heads, "head_dim": cfg["model"].head_dim,
                        "double_blocks": cfg["model"].double_blocks, "single_blocks": cfg["model"].single_blocks},
    }}
    log("overhead: meshdit (degrees 1) vs diffusers pipeline, interleaved")
    results["overhead"] = cpu_overhead(cfg["model"], **cfg["overhead"])
    scaling, comm, memory = scaling_sections(cfg, log)
    results["scaling"], results["communication"], results["memory"] = scaling, comm, memory
    if args.skip_gpu:
        results["gpu"] = {"skipped": "--skip-gpu"}
    else:
        log("gpu: FLUX.1-dev size overhead" if torch.cuda.is_available() else "gpu: none, skipped")
        results["gpu"] = gpu_overhead()
    results["meta"]["load_average_end"] = _load_average()
    results["meta"]["load_average_samples"] = load_samples
    results["meta"]["seconds"] = round(time.perf_counter() - began, 1)

    (out / "latest.json").write_text(json.dumps(results, indent=1, default=str))
    (out / "latest.md").write_text(write_markdown(results))
    write_png(results, out / "latest.png")
    log(f"wrote {out}/latest.json, latest.md, latest.png")
    print((out / "latest.md").read_text())
    return 0


if __name__ == "__main__":
    sys.exit(main())
