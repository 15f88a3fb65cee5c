"""Peak memory per rank of the VAE decode: serial, patch-parallel over N ranks, tiled.

    python benchmarks/vae_memory.py                  # ~10 min on 2 CPU cores; prints Markdown tables
    python benchmarks/vae_memory.py --quick          # smaller sizes, ~2 min

The VAE is FLUX.1's decoder structure (AutoencoderKL: 16 latent channels, 4 up
blocks, 3 nearest-2x upsamplers, 2+1 resnets per block, mid-block attention,
32 GroupNorm groups) built from config with random weights. To keep CPU time
sane the main sweep uses a quarter of its widths, (32, 64, 128, 128) instead of
(128, 256, 512, 512); activation memory is proportional to width, so full-width
figures are ~4x (the full-width check at the end shows the per-rank ratios are
the same).

Memory (meshdit.vae.memory, method "allocator"): the peak of the running sum of
CPU allocator events (torch.profiler, profile_memory) during the decode on each
rank; weights and memory allocated before the decode are excluded, op scratch
and the gathered image are included. The tables give the largest rank's peak.
"RSS" is the rise of the process's peak RSS (VmHWM, reset before the decode),
a coarse cross-check. Each rank runs one thread; 4 ranks share 2 cores here,
so times show overheads, not speed-ups.

The recorded results (tables, largest image within a budget, tiled and full-width checks) are in
docs/figures.md, "VAE decode memory".
"""
from __future__ import annotations

import argparse
import math
import os
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

FLUX1 = dict(in_channels=3, out_channels=3, latent_channels=16, layers_per_block=2, norm_num_groups=32,
             down_block_types=("DownEncoderBlock2D",) * 4, up_block_types=("UpDecoderBlock2D",) * 4,
             use_quant_conv=False, use_post_quant_conv=False)
QUARTER = (32, 64, 128, 128)
FULL = (128, 256, 512, 512)
MiB = 2**20


def _job(widths, px, settings_kw, seed=0):
    """Runs on every rank of a pool (or in-process for 1 rank); returns this rank's report."""
    import torch.distributed as dist
    from diffusers import AutoencoderKL

    from meshdit.vae import VaeDecodeSettings, decode, peak_memory_report, set_memory_method

    torch.set_num_threads(1)
    set_memory_method("allocator")
    torch.manual_seed(seed)
    vae = AutoencoderKL(**FLUX1, block_out_channels=widths).eval()
    z = torch.randn(1, 16, px // 8, px // 8, generator=torch.Generator().manual_seed(seed + 1))
    group = dist.group.WORLD if dist.is_initialized() else None
    if group is not None:
        dist.barrier()
    start = time.perf_counter()
    image = decode(vae, z, VaeDecodeSettings(**settings_kw), group)
    seconds = time.perf_counter() - start
    report = peak_memory_report()
    report["seconds"] = seconds
    report["image_sum"] = float(image.double().sum())
    return report


def run(ranks: int, widths, px, **settings_kw) -> dict:
    if ranks == 1:
        reports = [_job(widths, px, settings_kw)]
    else:
        from meshdit.testing.rank_pool import get_pool

        reports = get_pool(ranks).run(_job, widths, px, settings_kw, timeout=3600)
    worst = max(reports, key=lambda r: r["peak_bytes"])
    return {"peak": worst["peak_bytes"], "rss": max(r.get("peak_rss_delta_bytes", 0) for r in reports),
            "seconds": max(r["seconds"] for r in reports), "mode": worst["mode"],
            "sums": {round(r["image_sum"], 2) for r in reports}}


def largest_side(points: list[tuple[int, int]], budget: int, multiple: int = 64) -> int:
    """Largest square side (multiple of `multiple` px) whose peak fits `budget`, from a least-squares
    fit peak = a + b * pixels over the measured (side, peak) points."""
    xs = [s * s for s, _ in points]
    ys = [p for _, p in points]
    n = len(xs)
    mx, my = sum(xs) / n, sum(ys) / n
    b = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / max(sum((x - mx) ** 2 for x in xs), 1e-9)
    a = my - b * mx
    if budget <= a or b <= 0:
        return 0
    return int(math.sqrt((budget - a) / b)) // multiple * multiple


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[256, 512, 1024, 1536])
    parser.add_argument("--ranks", type=int, nargs="+", default=[1, 2, 4])
    parser.add_argument("--budgets-mib", type=int, nargs="+", default=[256, 1024])
    parser.add_argument("--tile", type=int, default=512)
    parser.add_argument("--overlap", type=int, default=64)
    parser.add_argument("--full-width-size", type=int, default=256, help="0 skips the full-width check")
    parser.add_argument("--quick", action="store_true", help="sizes 256 512 768, full-width check skipped")
    args = parser.parse_args()
    if args.quick:
        args.sizes, args.full_width_size = [256, 512, 768], 0

    results: dict[tuple[int, int], dict] = {}
    for ranks in args.ranks:
        for px in args.sizes:
            results[ranks, px] = run(ranks, QUARTER, px, parallel=ranks > 1)
            r = results[ranks, px]
            print(f"# ranks={ranks} {px}px peak {r['peak'] / MiB:.1f} MiB, {r['seconds']:.1f} s", file=sys.stderr)

    print(f"### VAE decode: peak activation memory per rank (FLUX.1 VAE structure at quarter width, fp32, batch 1)\n")
    print("| image | " + " | ".join(f"{n} rank{'s' * (n > 1)}" for n in args.ranks) + " | "
          + " | ".join(f"ratio {n}/1" for n in args.ranks if n > 1) + " | peak RSS rise, " + " / ".join(
              str(n) for n in args.ranks) + " ranks |")
    print("|---" * (1 + 2 * len(args.ranks)) + "|")
    for px in args.sizes:
        peaks = [results[n, px]["peak"] for n in args.ranks]
        ratios = [results[n, px]["peak"] / results[1, px]["peak"] for n in args.ranks if n > 1] if 1 in args.ranks else []
        print(f"| {px}x{px} | " + " | ".join(f"{p / MiB:.0f} MiB" for p in peaks) + " | "
              + " | ".join(f"{q:.2f}" for q in ratios) + " | "
              + " / ".join(f"{results[n, px]['rss'] / MiB:.0f}" for n in args.ranks) + " MiB |")
    print("\nSeconds per decode (slowest rank; 1 thread per rank, 2 cores in all):",
          ", ".join(f"{px}px: " + " / ".join(f"{results[n, px]['seconds']:.1f}" for n in args.ranks)
                    for px in args.sizes))
    bad = [(n, px) for (n, px), r in results.items() if len(r["sums"]) != 1]
    print(f"Every rank holds the same image: {'yes' if not bad else 'NO: ' + str(bad)}")

    print(f"\n### Largest square image within a memory budget per rank\n")
    print("| budget per rank | " + " | ".join(f"{n} rank{'s' * (n > 1)}" for n in args.ranks) + " |")
    print("|---" * (1 + len(args.ranks)) + "|")
    for budget in args.budgets_mib:
        cells = []
        for n in args.ranks:
            points = [(px, results[n, px]["peak"]) for px in args.sizes]
            fits = [px for px, p in points if p <= budget * MiB]
            measured = f"{max(fits)} px measured" if fits else "none measured"
            cells.append(f"{largest_side(points, budget * MiB)} px fit ({measured})")
        print(f"| {budget} MiB (quarter width) ~ {4 * budget} MiB full width | " + " | ".join(cells) + " |")
    print("\n'fit': least-squares peak = a + b * pixels over the measured sizes, rounded down to 64 px; "
          "'measured': the largest size above that stayed within the budget.")

    big = max(args.sizes)
    tiled = {n: run(n, QUARTER, big, parallel=n > 1, tile_height=args.tile, tile_width=args.tile,
                    tile_overlap=args.overlap) for n in args.ranks}
    print(f"\n### Tiled decode at {big}x{big} ({args.tile} px tiles, {args.overlap} px overlap)\n")
    print("| ranks | mode | peak per rank | vs untiled 1 rank | seconds |")
    print("|---|---|---|---|---|")
    for n, r in tiled.items():
        base = results[1, big]["peak"] if 1 in args.ranks else float("nan")
        print(f"| {n} | {r['mode']} | {r['peak'] / MiB:.0f} MiB | {r['peak'] / base:.2f} | {r['seconds']:.1f} |")

    if args.full_width_size:
        px = args.full_width_size
        full = {n: run(n, FULL, px, parallel=n > 1) for n in args.ranks}
        print(f"\n### Full width (128, 256, 512, 512) check at {px}x{px}\n")
        print("| ranks | peak per rank | ratio to 1 rank | quarter-width ratio |")
        print("|---|---|---|---|")
        for n, r in full.items():
            q = results[n, px]["peak"] / results[1, px]["peak"] if (n, px) in results else float("nan")
            print(f"| {n} | {r['peak'] / MiB:.0f} MiB | {r['peak'] / full[1]['peak']:.2f} | {q:.2f} |")

    from meshdit.testing.rank_pool import close_all_pools

    close_all_pools()


if __name__ == "__main__":
    main()
