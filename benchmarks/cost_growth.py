"""How cost grows with image tokens: `python -m benchmarks.cost_growth [--tokens 256 1024 2304 4096] [--rounds 3]`.

Runs the scaling and communication sections of `benchmarks.run` (the same rank job: interleaved rounds
of serial, the ceiling and every 2-rank method) at each token count, and draws two panels in
`cost_growth.png` (PIL, no matplotlib): seconds per denoising step against image tokens for serial and
each 2-rank method (meshdit), with each baseline's ceiling (serial seconds / ceiling: the best any
2-rank method can do here) drawn dashed; and bytes one rank sends per step. Writes cost_growth.md and
.json beside it. Add 16384 to --tokens where the machine allows (serial at 16k tokens is slow on CPU).
"""
from __future__ import annotations

import argparse
import json
import math
import os
import time
from pathlib import Path

from .models import FULL, QUICK
from .run import scaling_sections

_PALETTE = [(31, 119, 180), (255, 127, 14), (44, 160, 44), (214, 39, 40), (148, 103, 189), (140, 86, 75)]


def curves(scaling: dict, comm: dict) -> tuple[dict, dict]:
    """({label: [(tokens, seconds per step)]}, {label: [(tokens, bytes per step, max over ranks)]}).

    Labels: serial/<baseline>, ceiling/<baseline> (serial / ceiling speedup) and <method> (meshdit).
    A forward-unit method's step is one transformer call (no guidance), a step-unit one's a denoising step.
    """
    times: dict = {}
    for c in scaling["cases"]:
        tokens, med = c["image_tokens"], c["median_seconds"]
        for baseline, speedup in c["ceiling"].items():
            times.setdefault(baseline, []).append((tokens, med[baseline]))
            times.setdefault(baseline.replace("serial/", "ceiling/"), []).append((tokens, med[baseline] / speedup))
        for name, e in c["methods"].items():
            times.setdefault(name, []).append((tokens, e["meshdit"]["median_seconds"]))
    sent: dict = {}
    for c in comm["cases"]:
        for name, impls in c["methods"].items():
            sent.setdefault(name, []).append((c["image_tokens"], max(impls["meshdit"]["measured_bytes_per_rank"])))
    return times, sent


def _panel(draw, box, series: dict, title: str, unit: str, font, small) -> None:
    """Log-log line chart of {label: [(x, y)]} inside box = (x0, y0, x1, y1); ceiling/* dashed."""
    x0, y0, x1, y1 = box
    points = [p for pts in series.values() for p in pts if p[1] > 0]
    if not points:
        return
    lx = [math.log2(x) for x, _ in points]
    ly = [math.log10(y) for _, y in points]
    xmin, xmax = min(lx), max(lx) + 1e-9
    ymin, ymax = math.floor(min(ly)), math.ceil(max(ly) + 1e-9)

    def at(x, y):
        return (x0 + (x1 - x0) * (math.log2(x) - xmin) / (xmax - xmin),
                y1 - (y1 - y0) * (math.log10(y) - ymin) / max(ymax - ymin, 1))

    draw.text((x0, y0 - 22), title, fill="black", font=font)
    draw.line([(x0, y0), (x0, y1), (x1, y1)], fill="black")
    for e in range(ymin, ymax + 1):
        _, y = at(2 ** xmin, 10 ** e)
        draw.line([(x0 - 4, y), (x0, y)], fill="black")
        draw.text((x0 - 52, y - 7), f"1e{e} {unit}", fill="black", font=small)
    for x in sorted({x for x, _ in points}):
        px, _ = at(x, 10 ** ymin)
        draw.line([(px, y1), (px, y1 + 4)], fill="black")
        draw.text((px - 12, y1 + 6), str(x), fill="black", font=small)
    colours = {}
    for i, label in enumerate(sorted(l for l in series if not l.startswith("ceiling/"))):
        colours[label] = _PALETTE[i % len(_PALETTE)]
    for label, pts in series.items():
        pts = sorted(p for p in pts if p[1] > 0)
        base = label.replace("ceiling/", "serial/")
        colour = colours.get(base, (0, 0, 0)) if label.startswith("ceiling/") else colours[label]
        xy = [at(x, y) for x, y in pts]
        for a, b in zip(xy, xy[1:]):
            if label.startswith("ceiling/"):  # dashed
                n = max(1, int(math.dist(a, b) / 8))
                for k in range(0, n, 2):
                    draw.line([(a[0] + (b[0] - a[0]) * k / n, a[1] + (b[1] - a[1]) * k / n),
                               (a[0] + (b[0] - a[0]) * (k + 1) / n, a[1] + (b[1] - a[1]) * (k + 1) / n)],
                              fill=colour, width=2)
            else:
                draw.line([a, b], fill=colour, width=2)
        for p in xy:
            draw.ellipse([p[0] - 3, p[1] - 3, p[0] + 3, p[1] + 3], fill=colour)
        if xy:
            draw.text((xy[-1][0] + 6, xy[-1][1] - 7), label, fill=colour, font=small)


def write_png(times: dict, sent: dict, path: Path, subtitle: str) -> None:
    from PIL import Image, ImageDraw

    from .report import chart_fonts

    img = Image.new("RGB", (1400, 560), "white")
    draw = ImageDraw.Draw(img)
    font, small = chart_fonts()
    draw.text((70, 8), "Cost against image tokens, 2 ranks x 1 thread vs 1 rank (dashed: ceiling of that baseline)",
              fill="black", font=font)
    draw.text((70, 30), subtitle, fill=(90, 90, 90), font=small)
    _panel(draw, (90, 90, 600, 500), times, "seconds per step", "s", font, small)
    _panel(draw, (790, 90, 1250, 500), sent, "bytes one rank sends per step", "B", font, small)
    img.save(path)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.cost_growth", description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, nargs="+", default=[256, 1024, 2304, 4096],
                        help="image token counts (squares)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--quick", action="store_true", help="the tiny model (for tests)")
    parser.add_argument("--out", default="benchmarks/results")
    args = parser.parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    began, load = time.perf_counter(), os.getloadavg()[0]
    cfg = dict(size="quick" if args.quick else "full", model=QUICK if args.quick else FULL, tokens=args.tokens,
               text_tokens=8 if args.quick else 64, rounds=args.rounds)
    scaling, comm, _ = scaling_sections(cfg, lambda msg: print(f"[{time.perf_counter() - began:6.1f} s] {msg}",
                                                               flush=True))
    times, sent = curves(scaling, comm)
    subtitle = (f"{cfg['model'].name}, {cfg['text_tokens']} text tokens, medians of {args.rounds} interleaved rounds; "
                f"load average at start {load:.2f}")
    write_png(times, sent, out / "cost_growth.png", subtitle)
    (out / "cost_growth.json").write_text(json.dumps({"times": times, "bytes": sent, "subtitle": subtitle}, indent=1))
    rows = ["| series | " + " | ".join(str(t) for t in args.tokens) + " |", "|---|" + "---|" * len(args.tokens)]
    for label, pts in times.items():
        rows.append(f"| {label} s/step | " + " | ".join(f"{y:.4f}" for _, y in sorted(pts)) + " |")
    for label, pts in sent.items():
        rows.append(f"| {label} bytes/step | " + " | ".join(f"{y:,}" for _, y in sorted(pts)) + " |")
    (out / "cost_growth.md").write_text(
        f"# Cost against image tokens\n\n`python -m benchmarks.cost_growth --tokens {' '.join(map(str, args.tokens))}"
        f" --rounds {args.rounds}`; {subtitle}. Chart: cost_growth.png.\n\n" + "\n".join(rows) + "\n")
    print((out / "cost_growth.md").read_text())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
