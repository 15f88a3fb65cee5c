"""Which layouts fit 4 x 32 GB and 8 x 24 GB, in bf16 and FP8, for FLUX.2-dev (+ its text encoder), Wan 2.1-14B and
HunyuanVideo at their default sizes: the planner's per-rank memory predictions from the config snapshots alone
(meshdit/planner/snapshots, docs/planner.md has every formula), tensor parallelism included.

    python -m benchmarks.memory_table

Prints one markdown row per model, world and weight format: how many layouts fit, the fastest fitting one that gives
serial's image with every block on the GPUs, the same with --offload blocks, and the fastest of all (PipeFusion
after warmup included), each with its predicted peak per rank and where its text encoders are (on the GPU, split
over the ranks with --text-encoder-parallel, or on the host). FP8 rows are never serial's image: their columns
show the fastest FP8 layouts.
"""
from __future__ import annotations

from meshdit.config import GenerateRequest
from meshdit.planner.choose import load_model, make_plan
from meshdit.planner.hardware import world_from

MODELS = ("flux2-dev", "wan2.1-t2v-14b", "hunyuanvideo")
WORLDS = ((4, "32GB"), (8, "24GB"))


def _row(prediction) -> str:
    if prediction is None:
        return "none"
    where = ", text on host" if prediction.layout.text_on_cpu else \
        ", text split over the ranks" if prediction.layout.text_parallel else ""
    return f"{prediction.layout.describe()} ({prediction.memory.peak / 1e9:.1f} GB{where})"


def _first(rows, offload: bool | None = None, exact_only: bool = False):
    """The fastest of `rows` (they come fastest first) with that offload choice, exact ones only if asked."""
    rows = [r for r in rows if (offload is None or r.layout.offload == offload) and (r.exact or not exact_only)]
    return rows[0] if rows else None


def table() -> list[str]:
    lines = ["| model | world | weights | layouts that fit | fastest exact, blocks on the GPUs | "
             "fastest exact, blocks offloaded | fastest of all |",
             "|---|---|---|---|---|---|---|"]
    for model in MODELS:
        _, info, costs = load_model(model)
        for gpus, memory in WORLDS:
            world = world_from("h100-sxm", gpus, 1, memory)
            plan = make_plan(info, costs, GenerateRequest(prompt="p"), world)
            for fp8, label in ((False, "bf16"), (True, "FP8")):
                rows = [r for r in plan.rows if r.fits and r.layout.fp8 == fp8]
                exact = not fp8  # FP8 is never serial's image: its columns show the fastest FP8 layouts
                lines.append(f"| {model} | {gpus} x {memory} | {label} | {len(rows)} | "
                             f"{_row(_first(rows, False, exact))} | {_row(_first(rows, True, exact))} | "
                             f"{_row(_first(rows))} |")
    return lines


def main() -> None:
    print("\n".join(table()))


if __name__ == "__main__":
    main()

__all__ = ["table"]
