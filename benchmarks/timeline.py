"""Per-rank timelines: `python -m benchmarks.timeline [--tokens 1024] [--steps 4] [--out benchmarks/results]`.

One Engine.generate of the benchmark model per method (serial, serial with CFG, ulysses 2, ring 2,
PipeFusion 2 with 1 warmup step, CFG 2) on 2 gloo ranks x 1 thread, after a warm-up generate; every
message the ranks send or wait for is recorded (meshdit.distributed.timeline) and split into compute,
communication and waiting (benchmarks/timeline_chart.py says how). Writes timeline.svg and .png (one bar
per rank on one time axis) and timeline.md (seconds per category) under --out.
"""
from __future__ import annotations

import argparse
import os
import time
import warnings
from pathlib import Path

from .timeline_chart import COLOURS, segments, totals, write_png, write_svg

METHODS = {  # name -> (meshdit degrees, classifier-free guidance on)
    "serial": ({}, False), "serial-cfg": ({}, True), "ulysses2": (dict(ulysses_degree=2), False),
    "ring2": (dict(ring_degree=2), False), "pipefusion2": (dict(pipefusion_parallel_degree=2, warmup_steps=1), False),
    "cfg2": (dict(cfg_degree=2), True),
}


def timeline_job(method: str, tokens: int, steps: int) -> dict | None:
    """Every rank: one recorded generate (serial: rank 0 alone, rank 1 waits). Returns its spans."""
    warnings.filterwarnings("ignore")
    import torch.distributed as dist

    from dataclasses import replace

    from meshdit.distributed.timeline import timeline
    from meshdit.engine import Engine
    from meshdit.testing.rank_pool import mesh_for, split_layout

    from .jobs import _request
    from .models import FULL, flux_pipeline

    degrees, cfg = METHODS[method]
    config, settings = split_layout(degrees)
    runs = bool(degrees) or dist.get_rank() == 0
    engine = None
    if runs:  # a fresh pipeline: PipeFusion drops the other stage's blocks
        engine = Engine(flux_pipeline(FULL), mesh_for(config) if degrees else None)
    request = replace(_request(tokens, 64, steps, cfg), **settings)
    try:
        if engine:
            engine.generate(request)  # warm-up
        dist.barrier()
        if not engine:
            dist.barrier()
            return None
        with timeline.record() as spans:
            start = time.perf_counter()
            seconds = engine.generate(request).seconds
            end = time.perf_counter()
        dist.barrier()
    finally:
        if engine:
            engine.close()
    return {"rank": dist.get_rank(), "start": start, "end": end, "seconds": seconds,
            "spans": [(s.kind, s.start, s.end, s.peer) for s in spans]}


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=1024, help="image tokens (a square; default 1024)")
    parser.add_argument("--steps", type=int, default=4, help="denoising steps (default 4)")
    parser.add_argument("--methods", nargs="+", default=list(METHODS), choices=list(METHODS))
    parser.add_argument("--out", default="benchmarks/results", help="where timeline.svg and .md go")
    args = parser.parse_args(argv)
    from meshdit.testing.rank_pool import RankPool

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    load = os.getloadavg()[0]
    pool = RankPool(2)
    rows, table = [], []
    try:
        for method in args.methods:
            ranks = [r for r in pool.run(timeline_job, method, args.tokens, args.steps, timeout=1800) if r]
            origin = min(r["start"] for r in ranks)
            for r, segs in zip(ranks, segments(ranks)):
                label = f"{method} rank {r['rank']}" if len(ranks) > 1 else method
                rows.append((label, segs, origin))
                sums = totals(segs)
                table.append(f"| {label} | {r['end'] - r['start']:.3f} | {sums['compute']:.3f} | "
                             f"{sums['communication']:.3f} | {sums['waiting']:.3f} | {len(r['spans'])} |")
                print(table[-1], flush=True)
    finally:
        pool.close()
    title = (f"benchmark model flux-7m, {args.tokens} image tokens, {args.steps} steps, one generate per method; "
             f"2 gloo ranks x 1 thread (load {load:.2f})")
    write_svg(rows, out / "timeline.svg", title)
    write_png(rows, out / "timeline.png", title)
    header = ["| rank | generate s | compute s | communication s | waiting s | messages |", "|---|---|---|---|---|---|"]
    (out / "timeline.md").write_text(
        f"# Per-rank timeline\n\n`python -m benchmarks.timeline --tokens {args.tokens} --steps {args.steps}`; "
        f"{title}. Chart: timeline.svg / timeline.png ({', '.join(COLOURS)}).\n\n" + "\n".join(header + table) + "\n")
    print(f"wrote {out / 'timeline.svg'}, {out / 'timeline.png'} and {out / 'timeline.md'}")


if __name__ == "__main__":
    main()
