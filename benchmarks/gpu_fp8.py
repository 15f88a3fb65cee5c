"""FP8 on a GPU at FLUX.1-dev sizes: bf16 vs FP8 GEMM, attention, and a Ulysses all-to-all.

    python -m benchmarks.gpu_fp8                       # one GPU: GEMM, attention, codec cost
    torchrun --nproc-per-node 2 -m benchmarks.gpu_fp8  # adds the all-to-all over NCCL, bf16 vs FP8 bytes
    python -m benchmarks.gpu_fp8 --device cpu --small  # a smoke run of the same code on CPU

FLUX.1-dev: hidden 3072 (24 heads x 128), MLP 12288, 4096 image + 512 text tokens at 1024x1024.
Prints a markdown table of median milliseconds (CUDA events) and FP8 / bf16 ratios; reports which
FP8 attention path ran (a real kernel, or the emulation).
"""
from __future__ import annotations

import argparse
import os
import statistics
import time

import torch
import torch.distributed as dist

from meshdit.attention.fp8 import fp8_attention_with_lse, gpu_kernel
from meshdit.attention.kernels import attention_with_lse
from meshdit.quant.codec import Fp8WireCodec
from meshdit.quant.formats import fp8_dtype, fp8_gemm_problem
from meshdit.quant.fp8_linear import Fp8Linear


def timed(fn, device, rounds: int = 10) -> float:
    """Median seconds of fn() over `rounds` after a warmup."""
    fn()
    times = []
    for _ in range(rounds):
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        start = time.perf_counter()
        fn()
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--small", action="store_true", help="1/8 of the sizes (smoke runs)")
    args = parser.parse_args()
    distributed = "WORLD_SIZE" in os.environ and int(os.environ["WORLD_SIZE"]) > 1
    if distributed:
        dist.init_process_group("nccl" if args.device == "cuda" else "gloo")
        rank = dist.get_rank()
        device = torch.device(args.device, rank) if args.device == "cuda" else torch.device("cpu")
        if device.type == "cuda":
            torch.cuda.set_device(device)
    else:
        rank, device = 0, torch.device(args.device)
    div = 8 if args.small else 1
    hidden, heads, head_dim, tokens = 3072 // div, 24 // (2 if args.small else 1), 128 // (4 if args.small else 1), 4608 // div
    dtype = torch.bfloat16
    rows = []
    problem = fp8_gemm_problem(device)
    for name, (n_in, n_out) in {"qkv projection": (hidden, 3 * hidden), "MLP up": (hidden, 4 * hidden),
                                "MLP down": (4 * hidden, hidden)}.items():
        linear = torch.nn.Linear(n_in, n_out, device=device, dtype=dtype)
        x = torch.randn(tokens, n_in, device=device, dtype=dtype)
        fp8 = Fp8Linear(linear) if problem is None else None  # weights quantized once, as at load
        with torch.inference_mode():
            base = timed(lambda: linear(x), device)
            quant = timed(lambda: fp8(x), device) if fp8 is not None else float("nan")
        rows.append((f"GEMM {name} [{tokens} x {n_in}] x [{n_in} x {n_out}]", base, quant))
    q, k, v = (torch.randn(1, heads, tokens, head_dim, device=device, dtype=dtype) for _ in range(3))
    kernel = gpu_kernel(device)
    with torch.inference_mode():
        base = timed(lambda: attention_with_lse(q, k, v), device)
        quant = timed(lambda: fp8_attention_with_lse(q, k, v), device)
    path = "FlashAttention-3 FP8" if kernel is not None else "emulation"
    rows.append((f"attention {heads} heads x {head_dim}, {tokens} tokens (FP8: {path})", base, quant))
    codec = Fp8WireCodec(token_dim=2, format=fp8_dtype(device))
    world = dist.get_world_size() if distributed else 1
    shard = torch.randn(1, heads, tokens // max(world, 1), head_dim, device=device, dtype=dtype)
    base = timed(lambda: shard.clone(), device)
    quant = timed(lambda: codec.decode(codec.encode(shard), shard.shape, dtype), device)
    rows.append(("codec: copy vs FP8 encode + decode of a Q shard", base, quant))
    if distributed:
        from meshdit.attention.ulysses import seq_to_heads

        lens = [tokens // world] * world
        group = dist.group.WORLD
        base = timed(lambda: seq_to_heads(shard, group, lens), device)
        quant = timed(lambda: seq_to_heads(shard, group, lens, codec), device)
        rows.append((f"Ulysses all-to-all of Q over {world} GPUs ({codec.wire_bytes(shard.shape)} vs "
                     f"{shard.numel() * 2} bytes)", base, quant))
    if rank == 0:
        print(f"device: {torch.cuda.get_device_name(device) if device.type == 'cuda' else 'cpu'}; "
              f"FP8 format {fp8_dtype(device)}; FP8 GEMM: {problem or 'yes'}; FP8 attention: {path}")
        print("| operation | bf16 ms | FP8 ms | FP8 / bf16 |\n|---|---|---|---|")
        for op, b, qt in rows:
            print(f"| {op} | {b * 1e3:.3f} | {qt * 1e3:.3f} | {qt / b:.2f}x |")
    if distributed:
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
