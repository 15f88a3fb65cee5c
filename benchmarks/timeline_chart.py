"""Per-rank timelines from recorded spans: compute / communication / waiting, drawn as an SVG (by hand).

A rank's window (one Engine.generate) is split into
- waiting: the part of a message spent before the other rank arrived. For a collective, the time
  from this rank's entry to the last rank's entry (the k-th collective of each rank is the same
  one: every rank calls them in the same order); for a receive (PipeFusion), the time before the
  sender posted its k-th send to this rank; for the ring's wait, the time before the peer posted
  its k-th exchange; for PipeFusion's final wait on its sends, all of it (the receiver was late);
- communication: the rest of every span (moving the bytes, posting sends);
- compute: the rest of the window.
Spans come from meshdit.distributed.timeline; times are perf_counter seconds, one clock per machine.
"""
from __future__ import annotations

from collections import defaultdict

COLLECTIVES = ("all_to_all", "all_gather", "broadcast", "all_reduce")
COLOURS = {"compute": "#4c9a2a", "communication": "#2f6fdf", "waiting": "#e0442b"}


def segments(ranks: list[dict]) -> list[list[tuple[str, float, float]]]:
    """Per rank: (category, start, end) segments covering its window, in time order."""
    ordered = {r["rank"]: defaultdict(list) for r in ranks}  # rank -> key -> spans in order
    for r in ranks:
        for kind, start, end, peer in r["spans"]:
            key = ("collective", kind) if kind in COLLECTIVES else (kind, peer)
            ordered[r["rank"]][key].append((start, end))
    out = []
    for r in ranks:
        me, pieces = r["rank"], []
        seen: dict = defaultdict(int)
        for kind, start, end, peer in sorted(r["spans"], key=lambda s: s[1]):
            key = ("collective", kind) if kind in COLLECTIVES else (kind, peer)
            k = seen[key]
            seen[key] += 1
            arrived = start  # when the other side was there
            if kind in COLLECTIVES:
                arrived = max(ordered[o][key][k][0] for o in ordered if len(ordered[o][key]) > k)
            elif kind == "recv":
                sends = ordered.get(peer, {}).get(("send_post", me), [])
                arrived = sends[k][0] if k < len(sends) else start
            elif kind == "ring_wait":
                posts = ordered.get(peer, {}).get(("ring_post", me), [])
                arrived = posts[k][1] if k < len(posts) else start
            elif kind == "send_wait":
                arrived = end
            split = min(max(arrived, start), end)
            if split > start:
                pieces.append(("waiting", start, split))
            if end > split:
                pieces.append(("communication", split, end))
        out.append(_fill_compute(pieces, r["start"], r["end"]))
    return out


def _fill_compute(pieces, start: float, end: float):
    filled, cursor = [], start
    for category, a, b in sorted(pieces, key=lambda p: p[1]):
        a, b = max(a, cursor), min(b, end)
        if a > cursor:
            filled.append(("compute", cursor, a))
        if b > a:
            filled.append((category, a, b))
            cursor = b
    if end > cursor:
        filled.append(("compute", cursor, end))
    return filled


def totals(segs) -> dict[str, float]:
    sums = {c: 0.0 for c in COLOURS}
    for category, a, b in segs:
        sums[category] += b - a
    return sums


def write_svg(rows: list[tuple[str, list, float]], path, title: str) -> None:
    """rows: (label, segments, origin) drawn from origin on one shared time axis."""
    span = max((seg[-1][2] - origin for _, seg, origin in rows if seg), default=1.0)
    left, width, row_h, top = 230, 900, 26, 50
    height = top + row_h * len(rows) + 60
    scale = width / span
    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{left + width + 20}" height="{height}" '
             f'font-family="sans-serif" font-size="12">',
             f'<rect width="100%" height="100%" fill="white"/><text x="10" y="20" font-size="14">{title}</text>']
    for i, (label, segs, origin) in enumerate(rows):
        y = top + i * row_h
        parts.append(f'<text x="10" y="{y + 16}">{label}</text>')
        for category, a, b in segs:
            parts.append(f'<rect x="{left + (a - origin) * scale:.2f}" y="{y}" width="{max((b - a) * scale, 0.3):.2f}" '
                         f'height="{row_h - 6}" fill="{COLOURS[category]}"/>')
    axis_y = top + row_h * len(rows) + 5
    for tick in range(6):
        x = left + tick * width / 5
        parts.append(f'<line x1="{x}" y1="{axis_y}" x2="{x}" y2="{axis_y + 5}" stroke="black"/>'
                     f'<text x="{x - 10}" y="{axis_y + 18}">{tick * span / 5:.2f} s</text>')
    for j, (category, colour) in enumerate(COLOURS.items()):
        x = left + j * 160
        parts.append(f'<rect x="{x}" y="{axis_y + 30}" width="12" height="12" fill="{colour}"/>'
                     f'<text x="{x + 16}" y="{axis_y + 41}">{category}</text>')
    parts.append("</svg>")
    path.write_text("\n".join(parts))


def write_png(rows: list[tuple[str, list, float]], path, title: str) -> None:
    """The same chart as write_svg, drawn with PIL (for viewers without SVG)."""
    from PIL import Image, ImageDraw

    span = max((seg[-1][2] - origin for _, seg, origin in rows if seg), default=1.0)
    left, width, row_h, top = 230, 900, 26, 50
    height = top + row_h * len(rows) + 60
    scale = width / span
    img = Image.new("RGB", (left + width + 20, height), "white")
    draw = ImageDraw.Draw(img)
    draw.text((10, 8), title, fill="black")
    for i, (label, segs, origin) in enumerate(rows):
        y = top + i * row_h
        draw.text((10, y + 4), label, fill="black")
        for category, a, b in segs:
            x0 = left + (a - origin) * scale
            draw.rectangle([x0, y, x0 + max((b - a) * scale, 0.5), y + row_h - 6], fill=COLOURS[category])
    axis_y = top + row_h * len(rows) + 5
    for tick in range(6):
        x = left + tick * width / 5
        draw.line([x, axis_y, x, axis_y + 5], fill="black")
        draw.text((x - 10, axis_y + 8), f"{tick * span / 5:.2f} s", fill="black")
    for j, (category, colour) in enumerate(COLOURS.items()):
        x = left + j * 160
        draw.rectangle([x, axis_y + 30, x + 12, axis_y + 42], fill=colour)
        draw.text((x + 16, axis_y + 30), category, fill="black")
    img.save(path)
