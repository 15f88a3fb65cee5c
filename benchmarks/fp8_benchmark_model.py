"""FP8 options on the benchmark model (Flux-shaped, ~7 M parameters): error and bytes per layout.

    python -m benchmarks.fp8_benchmark_model [--tokens 1024] [--steps 3]

For each FP8 option alone and all together, under serial, ulysses 2, ring 2 and PipeFusion 2
(full warmup, so FP8 is the only difference): the relative L2 error of the guided noise
prediction of every step against fp32 serial SDPA, and the bytes one rank sends per step with
the bfloat16 cost of the same payloads (fp32 runs: 2.0 without --fp8-comm). Writes
benchmarks/results/fp8_benchmark_model.md.
"""
from __future__ import annotations

import argparse

LAYOUTS = {"serial": {}, "ulysses 2": dict(ulysses_degree=2), "ring 2": dict(ring_degree=2),
           "pipefusion 2, full warmup": dict(pipefusion_parallel_degree=2)}
OPTIONS = {"none": None, "gemm": dict(gemm=True), "attn": dict(attention="fp8"), "comm": dict(comm=True),
           "all": dict(gemm=True, attention="fp8", comm=True, comm_k=True)}


def run(degrees: dict, fp8_kwargs: dict | None, tokens: int, steps: int) -> dict:
    """On every rank: guided predictions of every step (None where this rank does not guide), bytes per step."""
    import torch

    from benchmarks.jobs import _request
    from benchmarks.models import FULL, flux_pipeline
    from dataclasses import replace

    from meshdit.config import ParallelConfig
    from meshdit.distributed.comm import comm_stats
    from meshdit.engine import Engine
    from meshdit.quant.settings import Fp8Config
    from meshdit.testing.rank_pool import mesh_for

    torch.set_num_threads(1)
    config = ParallelConfig(**degrees)
    pipe = flux_pipeline(FULL)  # fresh: FP8 weights and PipeFusion change it for good
    engine = Engine(pipe, mesh_for(config) if config.world_size > 1 else None,
                    fp8=Fp8Config(**fp8_kwargs) if fp8_kwargs else None)
    preds, guide = [], engine.recipe.guide

    def recording_guide(state, branch_preds):
        out = guide(state, branch_preds)
        preds.append(out.clone())
        return out

    engine.recipe.guide = recording_guide
    comm_stats.reset()
    try:
        engine.generate(replace(_request(tokens, 16, steps, cfg=True), warmup_steps=steps))  # PipeFusion: exact
    finally:
        engine.close()
    # the transformer's traffic: the kinds whose bfloat16 cost is counted (not the VAE's or CFG's)
    kinds = [k for k, v in comm_stats.bf16_bytes.items() if v]
    return dict(preds=torch.stack(preds) if preds else None,
                sent=sum(comm_stats.bytes_sent[k] for k in kinds) / steps,
                bf16=sum(comm_stats.bf16_bytes[k] for k in kinds) / steps)


def main() -> None:
    from meshdit.config import ParallelConfig
    from meshdit.testing.rank_pool import close_all_pools, get_pool

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tokens", type=int, default=1024)
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--out", default="benchmarks/results/fp8_benchmark_model.md")
    args = parser.parse_args()
    reference = run({}, None, args.tokens, args.steps)["preds"]
    rows = []
    try:
        for layout, degrees in LAYOUTS.items():
            for option, fp8 in OPTIONS.items():
                if option == "none" and not degrees or option == "comm" and not degrees:
                    continue  # the reference itself; nothing is sent serially
                world = ParallelConfig(**degrees).world_size
                results = (get_pool(world).run(run, degrees, fp8, args.tokens, args.steps, timeout=1800)
                           if world > 1 else [run(degrees, fp8, args.tokens, args.steps)])
                error = max(float((r["preds"] - reference).norm() / reference.norm())
                            for r in results if r["preds"] is not None)
                sent = max(r["sent"] for r in results)
                bf16 = max(r["bf16"] for r in results)
                ratio = f"{sent / bf16:.3f}" if bf16 else "-"
                row = f"| {layout} | {option} | {error:.4f} | {sent / 2**20:.2f} | {ratio} |"
                print(row, flush=True)
                rows.append(row)
    finally:
        close_all_pools()
    with open(args.out, "w") as f:
        f.write(f"Benchmark model (flux-7m), {args.tokens} image tokens, {args.steps} steps, true CFG 3, fp32 on CPU "
                "(`python -m benchmarks.fp8_benchmark_model`); error: relative L2 of every step's guided noise "
                "prediction against fp32 serial SDPA\n\n"
                "| layout | FP8 option | rel. error | transformer MiB sent per rank per step | ÷ bf16 bytes |\n"
                "|---|---|---|---|---|\n" + "\n".join(rows) + "\n")


if __name__ == "__main__":
    main()
