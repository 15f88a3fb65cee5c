"""Speed-up against PSNR of the step caches, from benchmarks/cache.py's JSON rows, drawn as an SVG (by hand), with
cache-dit's published FLUX.1-dev points for reference.

    python -m benchmarks.cache_chart benchmarks/results/cache_*.json --out docs/cache_speedup_psnr.svg

One point per cached row (model, steps, layout, cache setting): PSNR against the uncached image of the same run
(x), end-to-end speed-up over uncached in CPU time (y; `--wall` for wall-clock). The dashed lines are the issue's
bar: 1.8x at 30 dB.
"""
from __future__ import annotations

import argparse
import json
import math
from collections import defaultdict

# vipshop/cache-dit bench/README.md (commit 06c47df), FLUX.1-dev, 50 steps, DrawBench, NVIDIA L20: DBCache configs,
# speed-up as the ratio of TFLOPs, PSNR against uncached. Another model and device: for reference only.
PUBLISHED = [("F8B0 W4 MC0 R0.08", 1.80, 33.83), ("F8B0 W4 MC2 R0.12", 1.93, 32.73),
             ("F8B0 W4 MC3 R0.12", 2.05, 32.54), ("F4B0 W4 MC3 R0.12", 2.47, 31.80),
             ("F4B0 W4 MC4 R0.12", 2.66, 31.53)]
COLOURS = ["#2f6fdf", "#e0442b", "#4c9a2a", "#9b59b6", "#e69f00", "#17becf"]
X_RANGE, Y_RANGE = (20.0, 80.0), (0.5, 3.0)  # dB, speed-up
BAR = (30.0, 1.8)  # the bar: PSNR >= 30 dB at >= 1.8x


def series(records: list[dict], wall: bool = False) -> dict:
    """(model label, layout) -> [(cache, psnr dB, speed-up)], the cached rows with a finite PSNR."""
    out = defaultdict(list)
    for record in records:
        for row in record["rows"]:
            if row["cache"] == "uncached" or not math.isfinite(row["psnr_db"]):
                continue
            what = f"{row['model']}" + (f", {row['tokens']} tokens" if row.get("tokens") else "")
            out[(what, row["layout"])].append(
                (row["cache"], row["psnr_db"], row["speedup_wall" if wall else "speedup_cpu"]))
    return dict(out)


def svg(points: dict, title: str, measure: str) -> str:
    width, height, left, top, right, bottom = 760, 460, 60, 40, 250, 50
    plot_w, plot_h = width - left - right, height - top - bottom

    def x(db):
        return left + (min(max(db, X_RANGE[0]), X_RANGE[1]) - X_RANGE[0]) / (X_RANGE[1] - X_RANGE[0]) * plot_w

    def y(s):
        return top + plot_h - (min(max(s, Y_RANGE[0]), Y_RANGE[1]) - Y_RANGE[0]) / (Y_RANGE[1] - Y_RANGE[0]) * plot_h

    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" font-family="sans-serif" '
             f'font-size="11">', '<rect width="100%" height="100%" fill="white"/>',
             f'<text x="{left}" y="20" font-size="14">{title}</text>',
             f'<rect x="{left}" y="{top}" width="{plot_w}" height="{plot_h}" fill="none" stroke="#444"/>']
    for db in range(int(X_RANGE[0]), int(X_RANGE[1]) + 1, 10):
        parts.append(f'<line x1="{x(db):.1f}" y1="{top}" x2="{x(db):.1f}" y2="{top + plot_h}" stroke="#eee"/>'
                     f'<text x="{x(db) - 8:.1f}" y="{top + plot_h + 15}">{db}</text>')
    for tick in [0.5, 1.0, 1.5, 2.0, 2.5, 3.0]:
        parts.append(f'<line x1="{left}" y1="{y(tick):.1f}" x2="{left + plot_w}" y2="{y(tick):.1f}" stroke="#eee"/>'
                     f'<text x="{left - 32}" y="{y(tick) + 4:.1f}">{tick:.1f}x</text>')
    parts.append(f'<text x="{left + plot_w / 2 - 70}" y="{height - 12}">PSNR vs uncached (dB)</text>'
                 f'<text x="14" y="{top + plot_h / 2 + 40}" transform="rotate(-90 14 {top + plot_h / 2 + 40})">'
                 f'speed-up ({measure})</text>')
    parts.append(f'<line x1="{x(BAR[0]):.1f}" y1="{top}" x2="{x(BAR[0]):.1f}" y2="{top + plot_h}" stroke="#888" '
                 f'stroke-dasharray="4 3"/><line x1="{left}" y1="{y(BAR[1]):.1f}" x2="{left + plot_w}" '
                 f'y2="{y(BAR[1]):.1f}" stroke="#888" stroke-dasharray="4 3"/>')
    legend_y = top + 5
    models = sorted({what for what, _ in points})
    labels: list[tuple[float, float]] = []  # (x, y) of the labels drawn so far
    for (what, layout), rows in sorted(points.items()):
        colour = COLOURS[models.index(what) % len(COLOURS)]
        for cache, db, speedup in rows:
            cx, cy = x(db), y(speedup)
            shape = (f'<circle cx="{cx:.1f}" cy="{cy:.1f}" r="4.5" fill="{colour}"/>' if layout == "serial" else
                     f'<rect x="{cx - 4:.1f}" y="{cy - 4:.1f}" width="8" height="8" fill="{colour}"/>')
            parts.append(shape)
            if layout == "serial":  # a layout's point has the serial one's PSNR: one label per setting
                ly = cy - 5
                while any(abs(lx - cx) < 80 and abs(py - ly) < 10 for lx, py in labels):  # below the one in the way
                    ly += 11
                labels.append((cx, ly))
                parts.append(f'<text x="{cx + 6:.1f}" y="{ly:.1f}" font-size="9" fill="{colour}">'
                             f'{cache.replace(" (preset)", "")}</text>')
    for i, what in enumerate(models):
        parts.append(f'<circle cx="{left + plot_w + 15}" cy="{legend_y}" r="4.5" fill="{COLOURS[i % len(COLOURS)]}"/>'
                     f'<text x="{left + plot_w + 25}" y="{legend_y + 4}">{what}</text>')
        legend_y += 18
    for name, speedup, db in PUBLISHED:
        cx, cy = x(db), y(speedup)
        parts.append(f'<path d="M{cx:.1f},{cy - 5:.1f} L{cx + 5:.1f},{cy + 4:.1f} L{cx - 5:.1f},{cy + 4:.1f} Z" '
                     f'fill="none" stroke="#555"/>')
    parts.append(f'<path d="M{left + plot_w + 15},{legend_y - 5} L{left + plot_w + 20},{legend_y + 4} '
                 f'L{left + plot_w + 10},{legend_y + 4} Z" fill="none" stroke="#555"/>'
                 f'<text x="{left + plot_w + 25}" y="{legend_y + 4}">cache-dit DBCache, FLUX.1-dev 50 steps</text>'
                 f'<text x="{left + plot_w + 25}" y="{legend_y + 18}">(published, other model; TFLOPs ratio)</text>'
                 f'<text x="{left + plot_w + 10}" y="{legend_y + 44}">circle: serial; square: ulysses 2</text>'
                 f'<text x="{left + plot_w + 10}" y="{legend_y + 60}">dashed: 1.8x and 30 dB</text>')
    parts.append("</svg>")
    return "\n".join(parts) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("results", nargs="+", help="benchmarks/cache.py's JSON files")
    parser.add_argument("--out", default="docs/cache_speedup_psnr.svg")
    parser.add_argument("--wall", action="store_true", help="wall-clock speed-up instead of CPU time")
    args = parser.parse_args()
    records = []
    for path in args.results:
        with open(path) as f:
            records.append(json.load(f))
    measure = "wall-clock" if args.wall else "CPU time"
    with open(args.out, "w") as f:
        f.write(svg(series(records, args.wall), f"Step caching: speed-up ({measure}) against PSNR", measure))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
