"""Tensor parallel 2 against Ulysses 2 and serial on the benchmark model:
`python -m benchmarks.tensor_parallel [--tokens 1024 4096] [--steps 2] [--rounds 3]`.

Two gloo ranks x 1 thread (serial runs on rank 0 while rank 1 waits). For each method and image-token count it
prints the median seconds of one denoising step (the slower rank's), the bytes each rank sent per step by kind,
the transformer parameter bytes a rank holds, and the largest difference of its image from serial's. "ceiling"
runs serial's work on both ranks at once, no communication: 2 x serial's step over its step is the most any
2-rank method can reach here (the machine's two-process ceiling); efficiency = speed-up / ceiling.
docs/tensor-parallel.md holds the figures and what they mean.
"""
from __future__ import annotations

import argparse
import statistics
import warnings

METHODS = {"serial": {}, "ceiling": {}, "ulysses2": dict(ulysses_degree=2), "tp2": dict(tensor_parallel_degree=2)}
ALONE = ("serial", "ceiling")
"""Methods each rank runs as one process (serial: rank 0 only; ceiling: both ranks at once)."""


def method_job(method: str, tokens: int, steps: int, rounds: int) -> dict:
    """One method on both ranks of the pool: per-step seconds (medians of rounds), bytes per step, params."""
    warnings.filterwarnings("ignore")
    import torch
    import torch.distributed as dist

    from meshdit.config import ParallelConfig
    from meshdit.distributed.comm import comm_stats
    from meshdit.engine import Engine
    from meshdit.testing.rank_pool import mesh_for

    from .jobs import _request
    from .models import FULL, flux_pipeline

    serial = method in ALONE
    runs = dist.get_rank() == 0 or method != "serial"
    request = _request(tokens, 64, steps, cfg=False)
    engine = None
    if runs:
        pipe = flux_pipeline(FULL)  # same seed, same weights for every method
        engine = Engine(pipe) if serial else Engine(pipe, mesh_for(ParallelConfig(**METHODS[method])))
    try:
        image = engine.generate(request).images if engine else None  # warm-up
        comm_stats.reset()
        times = []
        for _ in range(rounds):
            dist.barrier()
            seconds = engine.generate(request).seconds["denoise"] / steps if engine else 0.0
            t = torch.tensor([seconds], dtype=torch.float64)
            dist.all_reduce(t, op=dist.ReduceOp.MAX)
            times.append(float(t.item()))
        sent = {k: v / (rounds * steps) for k, v in comm_stats.bytes_sent.items() if v}
        params = sum(p.numel() * p.element_size() for p in engine.pipe.transformer.parameters()) if engine else 0
        return {"method": method, "tokens": tokens, "step_s": statistics.median(times), "times": times,
                "bytes_per_step": sent, "param_bytes": params, "image": image}
    finally:
        if engine is not None:
            engine.close()


def run(tokens_list, steps: int, rounds: int) -> list[dict]:
    from meshdit.testing.rank_pool import close_all_pools, get_pool

    rows = []
    try:
        pool = get_pool(2)
        for tokens in tokens_list:
            serial_image = None
            for method in METHODS:
                results = pool.run(method_job, method, tokens, steps, rounds)
                row = results[0]
                if method == "serial":
                    serial_image = row["image"]
                if method == "ceiling":  # throughput: both ranks finish a serial step in the slower one's time
                    row["step_s"] /= 2
                row["max_abs_diff"] = float(abs(row["image"] - serial_image).max())
                row["params_by_rank"] = [r["param_bytes"] for r in results]
                rows.append(row)
    finally:
        close_all_pools()
    return rows


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, nargs="+", default=[1024, 4096], help="image tokens (squares)")
    parser.add_argument("--steps", type=int, default=2, help="denoising steps per generate (default 2)")
    parser.add_argument("--rounds", type=int, default=3, help="timed generates per method (default 3)")
    args = parser.parse_args(argv)
    rows = run(args.tokens, args.steps, args.rounds)
    print("| tokens | method | s / step | vs serial | efficiency (vs ceiling) | bytes sent / step / rank "
          "| transformer params / rank (MB) | max abs diff vs serial |")
    print("|---|---|---|---|---|---|---|---|")
    serial, ceiling = {}, {}
    for r in rows:
        serial.setdefault(r["tokens"], r["step_s"])
        if r["method"] == "ceiling":
            ceiling[r["tokens"]] = serial[r["tokens"]] / r["step_s"]
        speedup = serial[r["tokens"]] / r["step_s"]
        efficiency = f"{speedup / ceiling[r['tokens']]:.0%}" if r["method"] not in ALONE else "-"
        sent = ", ".join(f"{k} {v / 1e6:.2f} MB" for k, v in sorted(r["bytes_per_step"].items())) or "-"
        params = r["params_by_rank"][0] / 1e6 if r["method"] == "serial" else max(r["params_by_rank"]) / 1e6
        print(f"| {r['tokens']} | {r['method']} | {r['step_s']:.3f} | {speedup:.2f}x | {efficiency} "
              f"| {sent} | {params:.1f} | {r['max_abs_diff']:.2g} |")


if __name__ == "__main__":
    main()
