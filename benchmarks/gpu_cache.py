"""GPU check: step caching at FLUX.1-dev size (random weights), 28 steps, one or two GPUs, cache on and off.

    python -m benchmarks.gpu_cache                            # one GPU, serial
    torchrun --nproc-per-node 2 -m benchmarks.gpu_cache       # two GPUs, Ulysses 2
    python -m benchmarks.gpu_cache --device cpu --small       # a smoke run of the same code on CPU

FLUX.1-dev's transformer (19 double + 38 single blocks, 24 heads x 128, guidance-distilled: no CFG) with random
bf16 weights, tiny text encoders of its widths, a tiny VAE (factor 2: 256 x 256 px is FLUX.1-dev's 4096 image
tokens at 1024 x 1024). Per cache setting: seconds of the denoising loop (slowest rank, after one warm-up
generation), steps computed / total, speed-up over uncached in the same run, PSNR against uncached. Random
weights change more from step to step than trained ones (docs/caching.md), so the fixed-threshold rows show the
cost of the skipped steps, not the quality a trained model keeps.
"""
from __future__ import annotations

import argparse
import os
import time
from dataclasses import replace

import numpy as np
import torch
import torch.distributed as dist

FLUX_DEV = dict(in_channels=64, num_attention_heads=24, attention_head_dim=128, joint_attention_dim=4096,
                pooled_projection_dim=768, guidance_embeds=True, axes_dims_rope=(16, 56, 56), num_layers=19,
                num_single_layers=38)
SMALL = dict(FLUX_DEV, num_attention_heads=4, attention_head_dim=32, axes_dims_rope=(8, 12, 12), num_layers=4,
             num_single_layers=6, joint_attention_dim=64, pooled_projection_dim=32)
SETTINGS = {"uncached": None, "fast (preset)": dict(method="fast"), "fbcache (preset)": dict(method="fbcache"),
            "dbcache (preset)": dict(method="dbcache"),
            "dbcache F8B0 0.6": dict(method="dbcache", threshold=0.6, front_blocks=8, back_blocks=0)}


def build(device: torch.device, shape: dict, dtype: torch.dtype):
    from diffusers import FlowMatchEulerDiscreteScheduler, FluxPipeline, FluxTransformer2DModel

    from meshdit.testing.tiny_models import clip_text_model, clip_tokenizer, t5_text_model, t5_tokenizer, tiny_vae

    torch.manual_seed(0)
    with torch.device(device):
        transformer = FluxTransformer2DModel(**shape).to(dtype).eval()
    torch.manual_seed(1)
    pipe = FluxPipeline(
        scheduler=FlowMatchEulerDiscreteScheduler(use_dynamic_shifting=True), vae=tiny_vae(shape["in_channels"] // 4),
        text_encoder=clip_text_model(hidden=shape["pooled_projection_dim"]), tokenizer=clip_tokenizer(),
        text_encoder_2=t5_text_model(shape["joint_attention_dim"]), tokenizer_2=t5_tokenizer(), transformer=transformer)
    pipe.to(device, dtype)
    pipe.set_progress_bar_config(disable=True)
    return pipe


def main() -> None:
    from meshdit.cache import CacheSettings
    from meshdit.config import GenerateRequest, ParallelConfig
    from meshdit.distributed.mesh import ParallelMesh, init_distributed, teardown_distributed
    from meshdit.engine import Engine

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--small", action="store_true", help="a 10-block model at 64 x 64 px (smoke runs)")
    parser.add_argument("--steps", type=int, default=28)
    args = parser.parse_args()
    world = int(os.environ.get("WORLD_SIZE", "1"))
    device = torch.device(args.device)
    if args.device == "cuda":
        device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
    mesh = None
    if world > 1:
        init_distributed(device)
        mesh = ParallelMesh.build(ParallelConfig(ulysses_degree=world), device)
    dtype = torch.float32 if device.type == "cpu" else torch.bfloat16
    pipe = build(device, SMALL if args.small else FLUX_DEV, dtype)
    engine = Engine(pipe, mesh)
    side = 64 if args.small else 256
    request = GenerateRequest(prompt="a red cat on a blue square", height=side, width=side,
                              num_inference_steps=args.steps, guidance_scale=3.5, seed=0,
                              extra={"max_sequence_length": 32})
    rank0 = not dist.is_initialized() or dist.get_rank() == 0
    try:
        engine.generate(replace(request, num_inference_steps=2))  # warm-up: kernels, allocator
        rows, reference, base = [], None, None
        for label, fields in SETTINGS.items():
            cache = CacheSettings(**fields) if fields else CacheSettings()
            if device.type == "cuda":
                torch.cuda.synchronize(device)
            start = time.perf_counter()
            result = engine.generate(replace(request, cache=cache))
            if device.type == "cuda":
                torch.cuda.synchronize(device)
            seconds = torch.tensor([time.perf_counter() - start], dtype=torch.float64, device=device)
            if dist.is_initialized():
                dist.all_reduce(seconds, op=dist.ReduceOp.MAX)
            seconds = float(seconds.item())
            images = np.asarray(result.images, dtype=np.float64)
            reference = images if reference is None else reference
            base = seconds if base is None else base
            mse = float(((images - reference) ** 2).mean())
            computed = result.cache.computed_steps() if result.cache is not None else args.steps
            rows.append(f"| {label} | {computed} / {args.steps} | {seconds:.2f} | {base / seconds:.2f}x | "
                        f"{'inf' if mse == 0 else f'{10 * np.log10(1 / mse):.1f}'} dB |")
        if rank0:
            layout = f"ulysses {world}" if world > 1 else "serial"
            print(f"FLUX.1-dev-shaped random weights{' (small)' if args.small else ''}, {layout}, {args.steps} steps, "
                  f"{device.type}\n\n| cache | steps computed / total | seconds | speed-up | PSNR vs uncached |\n"
                  "|---|---|---|---|---|\n" + "\n".join(rows))
    finally:
        engine.close()
        teardown_distributed()


if __name__ == "__main__":
    main()
