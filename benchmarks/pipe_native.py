"""Pipe-native Ulysses 2 against the Engine's recipe path and diffusers' own `enable_parallelism` Ulysses 2, on 2 gloo
ranks at 4096 image tokens, side by side with the two-process ceiling.

    python -m benchmarks.pipe_native [--steps 2] [--rounds 3]

Every row times the same FLUX.1-shaped call (the tiny "flux-wide" weights: 4 heads x 64, 64 x 64 tokens, text of 16
tokens, true CFG off) end to end: text encoding, the denoising steps, the decode. serial: one process alone;
ceiling: 2 x serial / the time two processes take when each runs the serial call at once (what no 2-rank method can
beat on this machine's shared cores). Run it only on a quiet machine (load < 1.5): it prints the load it saw.
"""
from __future__ import annotations

import argparse
import os
import time

HEIGHT = WIDTH = 256  # 64 x 64 tokens of 4 pixels (VAE 2 x packing 2)
TEXT = 16


def _call(pipe, steps: int):
    import torch

    return pipe("a red cat on a blue square", height=HEIGHT, width=WIDTH, num_inference_steps=steps,
                max_sequence_length=TEXT, generator=torch.Generator().manual_seed(0), output_type="np").images


def _best(run, rounds: int) -> float:
    times = []
    for _ in range(rounds):
        start = time.perf_counter()
        run()
        times.append(time.perf_counter() - start)
    return min(times)


def rank_job(steps: int, rounds: int) -> dict:
    import numpy as np
    import torch
    import torch.distributed as dist

    import meshdit
    from benchmarks.diffusers_cp import enable_context_parallel
    from meshdit.config import GenerateRequest, ParallelConfig
    from meshdit.engine import Engine
    from meshdit.testing.rank_pool import mesh_for
    from meshdit.testing.tiny_models import tiny_pipeline

    def fresh():
        pipe = tiny_pipeline("flux-wide")
        pipe.set_progress_bar_config(disable=True)
        return pipe

    out = {}
    with torch.inference_mode():
        pipe = fresh()
        reference = _call(pipe, steps)
        dist.barrier()
        out["serial"] = _best(lambda: _call(pipe, steps), rounds) if dist.get_rank() == 0 else None
        dist.barrier()
        out["both serial"] = _best(lambda: _call(pipe, steps), rounds)  # both ranks at once
        mesh = mesh_for(ParallelConfig(ulysses_degree=2))
        meshdit.parallelize(pipe, mesh)
        out["pipe-native"] = _best(lambda: _call(pipe, steps), rounds)
        out["pipe-native diff"] = float(np.abs(_call(pipe, steps) - reference).max())
        meshdit.unparallelize(pipe)
        engine = Engine(pipe, mesh)
        request = GenerateRequest(prompt="a red cat on a blue square", height=HEIGHT, width=WIDTH, seed=0,
                                  num_inference_steps=steps, guidance_scale=1.0, extra={"max_sequence_length": TEXT})
        out["recipe"] = _best(lambda: engine.generate(request), rounds)
        engine.close()
        pipe = fresh()
        enable_context_parallel(pipe.transformer, ulysses_degree=2)
        out["diffusers"] = _best(lambda: _call(pipe, steps), rounds)
        out["diffusers diff"] = float(np.abs(_call(pipe, steps) - reference).max())
    return out


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args(argv)
    from meshdit.testing.rank_pool import close_all_pools, get_pool

    load = os.getloadavg()[0]
    try:
        results = get_pool(2).run(rank_job, args.steps, args.rounds, timeout=1800)
    finally:
        close_all_pools()
    r = {k: max(x[k] for x in results if x[k] is not None) for k in results[0]}
    ceiling = 2 * r["serial"] / r["both serial"]
    print(f"load before: {load:.2f}; {HEIGHT // 4 * WIDTH // 4} image tokens, {args.steps} steps, best of "
          f"{args.rounds}, 2 gloo ranks (slowest rank)")
    print("| path | seconds | speedup over serial | of the ceiling |")
    print("| --- | --- | --- | --- |")
    print(f"| serial (one process) | {r['serial']:.3f} | 1.00x | - |")
    print(f"| two-process ceiling | - | {ceiling:.2f}x | 100% |")
    for name in ("pipe-native", "recipe", "diffusers"):
        speedup = r["serial"] / r[name]
        print(f"| {name} Ulysses 2 | {r[name]:.3f} | {speedup:.2f}x | {100 * speedup / ceiling:.0f}% |")
    print(f"max |image - serial|: pipe-native {r['pipe-native diff']:.2e}, diffusers {r['diffusers diff']:.2e}")


if __name__ == "__main__":
    main()
