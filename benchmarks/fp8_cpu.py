"""FP8 against the working dtype on this CPU: GEMM, attention, wire codec (ratios of median times).

    python -m benchmarks.fp8_cpu [--out benchmarks/results/fp8_cpu.md]

FP8 is expected to be slower here: CPUs have no FP8 arithmetic, so torch._scaled_mm
converts FP8 to float32 before multiplying, each call also quantizes its input,
and the FP8 attention backend is an emulation (quantize, dequantize, float32
matmuls) around unfused math. On FP8 GPUs the same calls run on FP8 tensor cores
(benchmarks/gpu_fp8.py measures that).
"""
from __future__ import annotations

import argparse

import torch

from meshdit.attention.fp8 import emulated_fp8_attention
from meshdit.attention.kernels import attention_with_lse
from meshdit.quant.codec import Fp8WireCodec
from meshdit.planner.calibrate import median_seconds
from meshdit.quant.fp8_linear import Fp8Linear


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", default="benchmarks/results/fp8_cpu.md")
    args = parser.parse_args()
    torch.set_num_threads(1)
    torch.manual_seed(0)
    rows = []
    for dtype in (torch.float32, torch.bfloat16):
        name = str(dtype).replace("torch.", "")
        for tokens, hidden in ((1024, 256), (1024, 1024)):
            linear = torch.nn.Linear(hidden, 4 * hidden).to(dtype)
            fp8 = Fp8Linear(linear)
            x = torch.randn(tokens, hidden).to(dtype)
            with torch.inference_mode():
                base, quant = median_seconds(lambda: linear(x)), median_seconds(lambda: fp8(x))
            rows.append((f"Linear {hidden}->{4 * hidden}, {tokens} tokens", name, base, quant))
        q, k, v = (torch.randn(1, 4, 1024, 64).to(dtype) for _ in range(3))
        with torch.inference_mode():
            base = median_seconds(lambda: attention_with_lse(q, k, v))
            quant = median_seconds(lambda: emulated_fp8_attention(q, k, v))
        rows.append(("attention 4 heads x 64, 1024 tokens (FP8: emulation)", name, base, quant))
        x = torch.randn(1, 2, 2048, 64).to(dtype)
        codec = Fp8WireCodec(token_dim=2)
        base = median_seconds(lambda: x.contiguous().clone())
        quant = median_seconds(lambda: codec.decode(codec.encode(x), x.shape, dtype))
        rows.append(("wire: copy vs FP8 encode+decode, [1, 2, 2048, 64]", name, base, quant))
    lines = ["FP8 vs working dtype on this CPU, 1 thread, median of 7 (`python -m benchmarks.fp8_cpu`)", "",
             "| operation | working dtype | working dtype ms | FP8 ms | FP8 / working |", "|---|---|---|---|---|"]
    lines += [f"| {op} | {dt} | {b * 1e3:.2f} | {q * 1e3:.2f} | {q / b:.2f}x |" for op, dt, b, q in rows]
    lines += ["", "FP8 is slower on CPU: no FP8 arithmetic (torch._scaled_mm widens to float32), a per-call "
              "activation quantization, and an emulated attention; the point here is testability and bytes, "
              "not speed. Machine load affects the absolute times; ratios come from the same run."]
    with open(args.out, "w") as f:
        f.write("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
