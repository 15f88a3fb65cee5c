"""LoRA costs: `python -m benchmarks.lora [--tokens 1024] [--rounds 5] [--backends eager,aot_eager,inductor]`.

On the benchmark FLUX model (benchmarks/models.py FULL, random weights) with two random rank-R adapters on the
attention projections, serial, one thread:
- the switch: seconds of one `set_adapters` switch between requests (a -> b -> a+b -> none -> a, the engine's
  own `_use_adapters`), median over the rounds;
- each backend's denoising step with an adapter and without (medians), and under --compile the graphs dynamo
  compiled at each switch of the first round (a switch that recompiles shows there) with the seconds that generate
  took over a steady one, in the later rounds, and for an adapter weight no request used before;
- the adapter bytes each rank holds: serial and PipeFusion 2 (two gloo ranks, each stage loads only its blocks').
The figures are in docs/lora.md.
"""
from __future__ import annotations

import argparse
import statistics
import tempfile
import time
import warnings

SWITCHES = [(("a", 1.0),), (("b", 1.0),), (("a", 0.7), ("b", 0.5)), (), (("a", 1.0),)]


def _adapters(folder: str, rank: int) -> dict:
    from meshdit.testing.tiny_lora import save_tiny_lora

    from .models import FULL, flux_pipeline

    return {name: save_tiny_lora(flux_pipeline(FULL), f"{folder}/{name}.safetensors", seed=seed, rank=rank,
                                 scale=0.05) for name, seed in (("a", 1), ("b", 2))}


def _request(tokens: int, loras=(), steps: int = 2):
    from meshdit.config import GenerateRequest

    from .models import pixels_for_tokens

    side = pixels_for_tokens(tokens)
    return GenerateRequest(prompt="a red cat", height=side, width=side, num_inference_steps=steps,
                           guidance_scale=1.0, loras=loras, extra={"max_sequence_length": 16})


def switch_costs(adapters: dict, tokens: int, rounds: int, backend: str | None) -> dict:
    """One serial engine (compiled with `backend` unless None): switch seconds, step seconds, graphs compiled."""
    import torch
    from torch._dynamo.utils import counters

    from meshdit.config import ParallelConfig
    from meshdit.distributed.mesh import SingleProcessMesh
    from meshdit.engine import Engine

    from .models import FULL, flux_pipeline

    torch._dynamo.reset()
    mesh = SingleProcessMesh(torch.device("cpu"), ParallelConfig(compile=backend))
    engine = Engine(flux_pipeline(FULL), mesh, loras=adapters)
    runs: list[list[tuple]] = []  # per round, per switch: (switch s, step s, graphs compiled)

    def run(loras) -> tuple:
        before = counters["stats"]["unique_graphs"]
        t = time.perf_counter()
        engine._use_adapters(engine._adapters_of(_request(tokens, loras)))
        switched = time.perf_counter() - t
        step = engine.generate(_request(tokens, loras)).seconds["denoise"] / 2
        return switched, step, counters["stats"]["unique_graphs"] - before

    try:
        for _ in range(rounds):
            runs.append([run(loras) for loras in SWITCHES])
        new_weights = [run((("a", w),)) for w in (0.9, 0.8, 0.6)]  # weights no request used before
    finally:
        engine.close()
    later = runs[1:]
    steady = [statistics.median(r[i][1] for r in later) for i in range(len(SWITCHES))]
    return {"switch_ms": 1e3 * statistics.median(x[0] for r in runs for x in r),
            "step_ms_lora": 1e3 * statistics.median(x[1] for r in later for x, l in zip(r, SWITCHES) if l),
            "step_ms_base": 1e3 * statistics.median(x[1] for r in later for x, l in zip(r, SWITCHES) if not l),
            "first_round": [(x[2], 2 * (x[1] - s)) for x, s in zip(runs[0], steady)],  # (graphs, extra s)
            "graphs_later_rounds": sum(x[2] for r in later for x in r),
            "graphs_new_weights": [x[2] for x in new_weights]}


def held_bytes(adapters: dict, degrees: dict) -> list[int]:
    """LoRA bytes each rank holds after its engine is built (PipeFusion: its stage's blocks only)."""
    from meshdit.testing.rank_pool import get_pool, split_layout

    world = split_layout(degrees)[0].world_size
    return get_pool(world).run(_held_job, adapters, degrees) if world > 1 else [_held_job(adapters, degrees)]


def _held_job(adapters: dict, degrees: dict) -> int:
    warnings.filterwarnings("ignore")
    from meshdit.engine import Engine
    from meshdit.loading.lora import adapter_bytes
    from meshdit.testing.rank_pool import mesh_for, split_layout

    from .models import FULL, flux_pipeline

    config = split_layout(degrees)[0]
    pipe = flux_pipeline(FULL)
    engine = Engine(pipe, mesh_for(config) if config.world_size > 1 else None, loras={"a": adapters["a"]})
    engine.close()
    return adapter_bytes(pipe.transformer)


def _label(loras) -> str:
    return "+".join(f"{n}{w:g}" for n, w in loras) or "none"


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--tokens", type=int, default=1024, help="image tokens (a square)")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--rank", type=int, default=16, help="the adapters' LoRA rank")
    parser.add_argument("--backends", default="eager,aot_eager,inductor")
    args = parser.parse_args(argv)
    warnings.filterwarnings("ignore")
    import torch

    torch.set_num_threads(1)
    from meshdit.testing.rank_pool import close_all_pools

    with tempfile.TemporaryDirectory(prefix="meshdit-lora-") as folder:
        adapters = _adapters(folder, args.rank)
        print(f"benchmark FLUX model, {args.tokens} image tokens, adapters of rank {args.rank} on to_q/k/v/out, "
              f"{args.rounds} rounds of {len(SWITCHES)} switches")
        for backend in args.backends.split(","):
            r = switch_costs(adapters, args.tokens, args.rounds, None if backend == "eager" else backend)
            first = "; ".join(f"{_label(l)}: {g} graphs, +{s:.2f} s" for l, (g, s) in zip(SWITCHES, r["first_round"]))
            print(f"{backend:9s}: switch {r['switch_ms']:.2f} ms; step {r['step_ms_lora']:.1f} ms with LoRA, "
                  f"{r['step_ms_base']:.1f} ms without\n           first round (generate time over a steady "
                  f"one): {first}\n           graphs compiled in later rounds: {r['graphs_later_rounds']}; "
                  f"for 'a' at new weights 0.9, 0.8, 0.6: {r['graphs_new_weights']}")
        try:
            serial = held_bytes(adapters, {})
            stages = held_bytes(adapters, dict(pipefusion_parallel_degree=2))
        finally:
            close_all_pools()
        print(f"adapter bytes held: serial {serial[0]}; PipeFusion 2 per stage {stages} "
              f"({', '.join(f'{b / serial[0]:.2f}' for b in stages)} of serial)")


if __name__ == "__main__":
    main()
