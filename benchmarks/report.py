"""latest.md (tables, targets) and latest.png (bar chart drawn with PIL: no matplotlib needed)."""
from __future__ import annotations

from pathlib import Path

OVERHEAD_TARGET = 1.02
SPEEDUP_TARGET = 1.9
LARGE, SMALL = 4096, 1024  # the token counts the scaling targets speak of


def targets(results: dict) -> list[tuple[str, bool | None, str]]:
    """(target, met?, evidence); None where this run cannot tell (quick sizes, skipped section)."""
    rows = []
    o = results["overhead"]
    rows.append((f"overhead <= {OVERHEAD_TARGET}x", o["ratio"] <= OVERHEAD_TARGET, f"{o['ratio']:.3f}x"))
    rows.append(("overhead: same image", o["max_abs_image_diff"] == 0.0, f"max abs diff {o['max_abs_image_diff']:.2g}"))
    cases = {c["image_tokens"]: c for c in results["scaling"]["cases"]}
    for tokens, need_speedup in ((LARGE, True), (SMALL, False)):
        case = cases.get(tokens)
        for name in ("ulysses2", "ring2"):
            entry = case["methods"].get(name) if case else None
            if not entry or "diffusers" not in entry:
                rows.append((f"{name} at {tokens} tokens", None, "not measured in this run"))
                continue
            ours, theirs = entry["meshdit"]["speedup"], entry["diffusers"]["speedup"]
            if need_speedup:
                rows.append((f"{name} at {tokens} tokens >= {SPEEDUP_TARGET}x", ours >= SPEEDUP_TARGET, f"{ours:.2f}x"))
                rows.append((f"{name} at {tokens} tokens not below diffusers", ours >= theirs,
                             f"{ours:.2f}x vs {theirs:.2f}x"))
            else:
                rows.append((f"{name} at {tokens} tokens above diffusers", ours > theirs, f"{ours:.2f}x vs {theirs:.2f}x"))
    ratios = [(c["image_tokens"], name, impl, v) for c in results["communication"]["cases"]
              for name, impls in c["methods"].items() for impl, v in impls.items() if v["formula_bytes"]]
    worst = max(ratios, key=lambda r: abs(r[3]["ratio"] - 1)) if ratios else None
    rows.append(("measured bytes within 10% of formula", all(r[3]["within_tolerance"] for r in ratios) if ratios else None,
                 f"worst {worst[1]}/{worst[2]} at {worst[0]} tokens: {worst[3]['ratio']:.4f}" if worst else "none"))
    return rows


def _yes(flag) -> str:
    return {True: "met", False: "NOT met", None: "n/a"}[flag]


def _pct(x) -> str:
    return f"{x:.0%}" if x is not None else "-"


def _mb(n) -> str:
    return f"{n / 2**20:.2f}" if n is not None else "-"


def write_markdown(r: dict) -> str:
    meta = r["meta"]
    lines = [f"# meshdit benchmarks ({'quick' if meta['quick'] else 'full'} run)", "",
             f"{meta['date_utc']}, commit {meta['commit']}; {meta['cpus']} CPUs; torch {meta['torch']}, "
             f"diffusers {meta['diffusers']}; the run took {meta['seconds']} s.",
             f"Load average (1, 5, 15 min) at start {meta['load_average_start']}, at end {meta['load_average_end']}; "
             f"1-min load sampled between sections: {[v for _, v in meta.get('load_average_samples', [])]}.",
             f"Model: {meta['model']} {meta['model_shape']} (FluxTransformer2DModel, random weights, fp32).", "",
             "Speed is judged by ratios measured side by side in this one run, never by absolute seconds.", ""]

    o = r["overhead"]
    lines += ["## 1. Overhead: meshdit (all degrees 1) vs diffusers pipeline", "",
              f"{o['model']}, {o['height']}x{o['width']} ({o['image_tokens']} image tokens), {o['steps']} steps, "
              f"{o['device']}, {o['pairs']} interleaved pairs (A, B, A, B, ...).", "",
              "| meshdit median s | diffusers median s | ratio (meshdit / diffusers) | max abs image diff |",
              "|---|---|---|---|",
              f"| {o['median_seconds']['meshdit']:.4f} | {o['median_seconds']['diffusers']:.4f} | **{o['ratio']:.3f}** "
              f"| {o['max_abs_image_diff']:.3g} |", ""]

    s = r["scaling"]
    lines += ["## 2. Scaling: 2 ranks x 1 thread vs 1 rank x 1 thread", "",
              f"Units: {s['unit_note']}. Medians over interleaved rounds; a round's parallel time is the slower "
              "rank's. diffusers = its own context parallelism (`enable_parallelism(ContextParallelConfig)`) on "
              "CPU through the shim in benchmarks/diffusers_cp.py.", "",
              "Ceiling: the same serial work run by both ranks at once with no communication; its throughput "
              "over one rank's is what no 2-rank method can beat on this machine. Efficiency = speedup / ceiling.", "",
              "| image tokens | text tokens | method | unit | serial s | ceiling | meshdit s | meshdit speedup "
              "| meshdit efficiency | diffusers s | diffusers speedup | diffusers efficiency "
              "| meshdit / diffusers speed | max abs diff vs serial (meshdit; diffusers) |",
              "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    skipped = {}
    for c in s["cases"]:
        skipped.update(c.get("skipped", {}))
        for name, e in c["methods"].items():
            mine, theirs = e["meshdit"], e.get("diffusers")
            serial = c["median_seconds"][e["baseline"]]
            ceiling = c.get("ceiling", {}).get(e["baseline"])
            lines.append(
                f"| {c['image_tokens']} | {c['text_tokens']} | {name} | {e['unit']} | {serial:.4f} | "
                f"{f'{ceiling:.2f}x' if ceiling else '-'} | "
                f"{mine['median_seconds']:.4f} | **{mine['speedup']:.2f}x** | {_pct(mine.get('efficiency'))} | "
                + (f"{theirs['median_seconds']:.4f} | {theirs['speedup']:.2f}x | {_pct(theirs.get('efficiency'))} | "
                   f"{theirs['median_seconds'] / mine['median_seconds']:.3f} | " if theirs else "- | - | - | - | ")
                + f"{mine['max_abs_diff_vs_serial']:.2g}; "
                + (f"{theirs['max_abs_diff_vs_serial']:.2g} |" if theirs else "- |"))
    waits = [c["waiting_rank_cpu_fraction"] for c in s["cases"] if c.get("waiting_rank_cpu_fraction") is not None]
    if waits:
        verdict = ("it waits without spinning, so the 1-rank baseline had a core to itself" if max(waits) < 0.1
                   else "it competed with the baseline for CPU: the serial figure is pessimistic")
        lines += ["", f"While rank 0 ran the serial baseline, waiting rank 1 (in a gloo barrier) used {max(waits):.1%} "
                      f"of a CPU: {verdict}."]
    for name, why in skipped.items():
        lines += ["", f"Skipped {name}: {why}"]
    for name, note in s.get("notes", {}).items():
        lines += ["", f"{name}: {note}"]
    lines.append("")

    cm = r["communication"]
    lines += ["## 3. Communication: bytes sent per rank per denoising step", "",
              "Counted at the collectives (meshdit: `meshdit.distributed.comm.comm_stats`; diffusers: a counting "
              "wrapper around the functional collectives it calls). Formulas (elements; x4 bytes in fp32), "
              "S = text + image tokens, p = image tokens, hs = hidden, L = attention layers, out = proj_out width:", ""]
    lines += [f"- {name}: `{text}`" for name, text in cm["formulas"].items()]
    lines += ["", "| image tokens | method | impl | measured rank 0 | measured rank 1 | formula | measured / formula |"
                  " within 10% |", "|---|---|---|---|---|---|---|---|"]
    for c in cm["cases"]:
        for name, impls in c["methods"].items():
            for impl, v in impls.items():
                f = v["formula_bytes"]
                f_text = (" / ".join(f"{x:,}" for x in f) if isinstance(f, list) else f"{f:,}") if f else "-"
                lines.append(f"| {c['image_tokens']} | {name} | {impl} | {v['measured_bytes_per_rank'][0]:,} | "
                             f"{v['measured_bytes_per_rank'][1]:,} | {f_text} | "
                             f"{v['ratio']:.4f} | {_yes(v['within_tolerance'])} |" if f else
                             f"| {c['image_tokens']} | {name} | {impl} | {v['measured_bytes_per_rank'][0]:,} | "
                             f"{v['measured_bytes_per_rank'][1]:,} | - | - | n/a |")
    lines.append("")

    mem = r["memory"]
    lines += ["## 4. Memory per rank", "", mem["how"], "",
              "| image tokens | configuration | rank | parameter MiB | peak activation MiB |", "|---|---|---|---|---|"]
    for c in mem["cases"]:
        for label, per_rank in c["rows"].items():
            for rank, row in enumerate(per_rank):
                if row:
                    lines.append(f"| {c['image_tokens']} | {label} | {rank} | {_mb(row['param_bytes'])} | "
                                 f"{_mb(row['peak_activation_bytes'])} |")
    lines.append("")

    g = r["gpu"]
    lines += ["## 5. GPU overhead (FLUX.1-dev size)", ""]
    if "skipped" in g:
        lines += [f"Skipped: {g['skipped']}.", ""]
    else:
        lines += [f"{g['device']}: {g['model']}, {g['transformer_params'] / 1e9:.1f} B transformer parameters, "
                  f"{g['height']}x{g['width']}, {g['steps']} steps, {g['pairs']} interleaved pairs.", "",
                  "| meshdit median s | diffusers median s | ratio | max abs image diff |", "|---|---|---|---|",
                  f"| {g['median_seconds']['meshdit']:.3f} | {g['median_seconds']['diffusers']:.3f} | "
                  f"**{g['ratio']:.3f}** | {g['max_abs_image_diff']:.3g} |", ""]

    lines += ["## Targets", "", "| target | result | figure |", "|---|---|---|"]
    lines += [f"| {name} | {_yes(flag)} | {why} |" for name, flag, why in targets(r)]
    if meta["quick"]:
        lines += ["", "Quick run: tiny model and token counts; the 1k/4k targets are not measured."]
    return "\n".join(lines) + "\n"


# -- PNG -----------------------------------------------------------------------------------------------------------

_COLORS = {"meshdit": (31, 119, 180), "diffusers": (255, 127, 14)}


def write_png(r: dict, path: Path) -> None:
    """Grouped bars: speedup over 1 rank per method and token count, meshdit beside diffusers."""
    from PIL import Image, ImageDraw

    groups = []  # (label, {impl: speedup})
    ceilings = []  # per group: the ceiling of its baseline, drawn as a black line
    for c in r["scaling"]["cases"]:
        for name, e in c["methods"].items():
            ceilings.append(c.get("ceiling", {}).get(e["baseline"]))
            groups.append((f"{name} @ {c['image_tokens']}", {k: e[k]["speedup"] for k in ("meshdit", "diffusers")
                                                              if k in e}))
    width, height = max(640, 90 + 130 * len(groups)), 460
    left, right, top, bottom = 70, 20, 60, 80
    img = Image.new("RGB", (width, height), "white")
    draw = ImageDraw.Draw(img)
    font, small = chart_fonts()
    o = r["overhead"]
    draw.text((left, 10), f"Speedup, 2 ranks x 1 thread vs 1 rank x 1 thread ({r['meta']['model']}); "
              f"overhead vs diffusers {o['ratio']:.3f}x", fill="black", font=font)
    draw.text((left, 32), f"{r['meta']['date_utc']}, load average at start {r['meta']['load_average_start']}",
              fill=(90, 90, 90), font=small)
    top_value = max([2.0] + [v for _, d in groups for v in d.values()] + [v for v in ceilings if v]) * 1.1
    plot_h = height - top - bottom

    def y(v):
        return top + plot_h - plot_h * v / top_value

    draw.line([(left, top), (left, top + plot_h), (width - right, top + plot_h)], fill="black")
    for tick in [0.5 * i for i in range(int(top_value / 0.5) + 1)]:
        draw.line([(left - 4, y(tick)), (left, y(tick))], fill="black")
        draw.text((left - 40, y(tick) - 7), f"{tick:.1f}", fill="black", font=small)
    for ref, color in ((1.0, (150, 150, 150)), (SPEEDUP_TARGET, (200, 0, 0))):
        for x in range(left, width - right, 8):
            draw.line([(x, y(ref)), (x + 4, y(ref))], fill=color)
    draw.text((width - right - 120, y(SPEEDUP_TARGET) - 16), f"target {SPEEDUP_TARGET}x", fill=(200, 0, 0), font=small)
    slot = (width - left - right) / max(1, len(groups))
    for i, (label, values) in enumerate(groups):
        x0 = left + i * slot + slot * 0.15
        if ceilings[i]:
            draw.line([(x0 - 4, y(ceilings[i])), (x0 + slot * 0.7, y(ceilings[i]))], fill="black", width=2)
            draw.text((x0, y(ceilings[i]) - 15), f"ceiling {ceilings[i]:.2f}", fill="black", font=small)
        bar = slot * 0.7 / 2
        for j, impl in enumerate(("meshdit", "diffusers")):
            if impl not in values:
                continue
            bx = x0 + j * bar
            draw.rectangle([bx, y(values[impl]), bx + bar - 4, y(0)], fill=_COLORS[impl])
            draw.text((bx, y(values[impl]) - 15), f"{values[impl]:.2f}", fill="black", font=small)
        draw.text((x0, top + plot_h + 8), label, fill="black", font=small)
    for j, impl in enumerate(("meshdit", "diffusers")):
        lx = left + j * 140
        draw.rectangle([lx, height - 30, lx + 14, height - 16], fill=_COLORS[impl])
        draw.text((lx + 20, height - 32), impl, fill="black", font=font)
    img.save(path)


def chart_fonts(size: int = 16, small: int = 12):
    """(title font, label font) for the PIL charts; Pillow < 10.1 has one bitmap size only."""
    from PIL import ImageFont

    try:
        return ImageFont.load_default(size=size), ImageFont.load_default(size=small)
    except TypeError:
        font = ImageFont.load_default()
        return font, font
