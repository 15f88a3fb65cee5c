"""The planner's memory predictions against measurement (issue 46 item 3), on CPU ranks here.

For each layout the benchmark model (benchmarks/models.py, saved as a pipeline folder) is loaded by every rank as
`meshdit generate` loads it (rank.start_rank), and one generate runs under meshdit.memory.PeakAllocations. Per rank:
the transformer's parameter bytes the rank holds (not on the meta device: PipeFusion's other stages' blocks are
never loaded) and the peak of the tensors the generate allocated (activations, stale K/V, VAE decode); the planner
predicts the same two (predict.Memory: weights without the VAE, max(activations + stale K/V, VAE decode)).

    python -m benchmarks.planner_memory [--model benchmark|wan] [--tokens 1024] [--steps 3]

--model wan: the Wan-shaped video model of benchmarks/video_scaling.py (4 heads x 64, 4 blocks), 256 x 256 px
frames (256 tokens a latent frame), as many latent frames as --tokens asks.
"""
from __future__ import annotations

import argparse
import json
import os
import tempfile

LAYOUTS = {
    "serial": {},
    "ulysses2": {"ulysses_degree": 2},
    "pp2": {"pipefusion_parallel_degree": 2},
    "pp4": {"pipefusion_parallel_degree": 4},
    "cfg2": {"cfg_degree": 2},
    "tp2": {"tensor_parallel_degree": 2},
    "tp2 x ulysses2": {"tensor_parallel_degree": 2, "ulysses_degree": 2},
    "offload": {"offload": "blocks"},
}
"""Degrees per layout; "offload" (--offload blocks) is a loading option, not a degree."""


def _rank_job(payload) -> None:
    import torch
    import torch.distributed as dist

    from meshdit.memory import PeakAllocations
    from meshdit.rank import start_rank

    from meshdit.parallel.offload import BlockOffload

    settings, request, out_dir = payload
    ranked = start_rank(settings)
    transformer = ranked.engine.pipe.transformer
    weights = sum(p.numel() * p.element_size() for p in transformer.parameters() if p.device.type != "meta")
    ranked.engine.generate(request)  # warm: first-call allocations (caches) are not the layout's
    with PeakAllocations() as peak:
        ranked.engine.generate(request)
    working = peak.peak_bytes
    offloads = [h for h in ranked.engine._parallel.handles if isinstance(h, BlockOffload)]
    if offloads:  # the non-block weights, and the most block bytes the device held at once (their host copies
        # are what the device would not hold)
        weights = sum(p.numel() * p.element_size() for p in transformer.parameters() if p.device.type != "meta") \
            - sum(p.numel() * p.element_size() for o in offloads for b in o.blocks for p in b.parameters()) \
            + sum(o.most_bytes_on_device for o in offloads)
        working = peak.peak_bytes - sum(o.most_bytes_on_device for o in offloads)  # the copies are counted above
    with open(os.path.join(out_dir, f"rank{dist.get_rank()}.json"), "w", encoding="utf-8") as f:
        json.dump({"weights": weights, "working": working}, f)
    del torch


def measure(folder: str, name: str, request, degrees: dict) -> list[dict]:
    from meshdit.config import ParallelConfig
    from meshdit.distributed.launch import launch
    from meshdit.engine_settings import EngineSettings
    from meshdit.loading import LoadOptions

    degrees = dict(degrees)
    loading = LoadOptions(offload=degrees.pop("offload", None))
    config = ParallelConfig(**degrees)
    settings = EngineSettings(folder, config, "float32", loading=loading)
    with tempfile.TemporaryDirectory(prefix="meshdit-planner-memory-") as out:
        launch(_rank_job, (settings, request, out), config.world_size)
        ranks = []
        for rank in range(config.world_size):
            with open(os.path.join(out, f"rank{rank}.json"), encoding="utf-8") as f:
                ranks.append(json.load(f))
    return ranks


def predicted(folder: str, request, degrees: dict, rank: int):
    from meshdit.mesh_axes import AXES, MeshAxis
    from meshdit.planner.choose import load_model
    from meshdit.planner.hardware import world_from
    from meshdit.planner.layouts import Layout
    from meshdit.planner.predict import predict
    from meshdit.request import fill_defaults

    _, info, costs = load_model(folder)
    layout = Layout(tuple((a.name, degrees.get(a.field, 1)) for a in AXES),
                    vae="plain", offload="offload" in degrees)
    world = world_from("cpu-here", layout.world_size, 1)
    inner = layout.sp * layout.degree(MeshAxis.TP)  # ranks inside one stage (ring, ulysses, tp vary faster)
    stage = rank // inner % layout.degree(MeshAxis.PP)  # the rank's pp coordinate
    p = predict(layout, costs, world, fill_defaults(request, info.request_defaults()), stage=stage)
    weights = p.memory.weights - costs.vae_params * world.dtype_bytes
    return weights, max(p.memory.activations + p.memory.stale_kv, p.memory.vae)


def _benchmark_model(tokens: int, steps: int):
    from benchmarks.models import FULL, flux_pipeline, pixels_for_tokens
    from meshdit.config import GenerateRequest

    px = pixels_for_tokens(tokens)
    return flux_pipeline(FULL), GenerateRequest(prompt="a red circle", height=px, width=px, num_inference_steps=steps,
                                                guidance_scale=3.0, seed=0, extra={"max_sequence_length": 32})


def _video_model(tokens: int, steps: int):
    from benchmarks.video_scaling import TOKEN_SIDE, wan_pipeline
    from meshdit.config import GenerateRequest

    latent_frames = max(1, tokens // TOKEN_SIDE ** 2)
    return wan_pipeline(), GenerateRequest(prompt="a red circle", height=256, width=256,
                                           num_frames=4 * (latent_frames - 1) + 1, num_inference_steps=steps,
                                           guidance_scale=3.0, seed=0, extra={"max_sequence_length": 32})


MODELS = {"benchmark": _benchmark_model, "wan": _video_model}
"""Name -> (tokens, steps) -> (pipeline, request)."""


def compare(tokens: int, steps: int, layouts: list[str], model: str = "benchmark") -> list[dict]:
    """One row per layout and rank: measured and predicted weights and working set, in bytes."""
    pipe, request = MODELS[model](tokens, steps)
    rows = []
    with tempfile.TemporaryDirectory(prefix="meshdit-benchmark-model-") as folder:
        pipe.save_pretrained(folder)
        del pipe
        for name in layouts:
            for rank, r in enumerate(measure(folder, name, request, LAYOUTS[name])):
                weights_p, working_p = predicted(folder, request, LAYOUTS[name], rank)
                rows.append({"layout": name, "rank": rank, "weights": r["weights"], "working": r["working"],
                             "weights_predicted": weights_p, "working_predicted": working_p,
                             "ratio": (r["weights"] + r["working"]) / (weights_p + working_p)})
    return rows


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", choices=list(MODELS), default="benchmark")
    parser.add_argument("--tokens", type=int, default=1024, help="image tokens (a square; video: latent frames x 256)")
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--layouts", nargs="+", default=list(LAYOUTS), choices=list(LAYOUTS))
    args = parser.parse_args(argv)
    print("| layout | rank | weights measured / predicted MiB | working set measured / predicted MiB | "
          "total measured / predicted |")
    print("|---|---|---|---|---|")
    for r in compare(args.tokens, args.steps, args.layouts, args.model):
        print(f"| {r['layout']} | {r['rank']} | {r['weights'] / 2**20:.1f} / {r['weights_predicted'] / 2**20:.1f} | "
              f"{r['working'] / 2**20:.1f} / {r['working_predicted'] / 2**20:.1f} | {r['ratio']:.2f} |", flush=True)


if __name__ == "__main__":
    main()
