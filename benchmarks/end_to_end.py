"""Wall time of `meshdit generate` on the bundled default model, start to saved PNG, in one process.

    python -m benchmarks.end_to_end            # 5 interleaved rounds, ~1.5 min on 2 CPU cores
    python -m benchmarks.end_to_end --rounds 9

Each round runs, as fresh processes one after the other:
  * meshdit:  `meshdit generate --prompt ... --output <tmp>.png` (the model's defaults: 256x256, true CFG);
  * floor:    a plain Python process that imports diffusers' FluxPipeline and loads the same folder with
              FluxPipeline.from_pretrained, and nothing else: the start-up that any diffusers user pays.
The rows give the median and range of each; "meshdit - floor" is what meshdit adds (its own imports,
the mesh, the generation, the PNG). Interleaving keeps a busy spell of the machine from landing on one side.
"""
from __future__ import annotations

import argparse
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

PROMPT = "two green squares on a white background"


def _wall(command: list[str]) -> float:
    start = time.perf_counter()
    proc = subprocess.run(command, capture_output=True, text=True)
    seconds = time.perf_counter() - start
    if proc.returncode:
        raise SystemExit(f"{' '.join(command)} failed:\n{proc.stderr[-2000:]}")
    return seconds


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args(argv)

    from meshdit.default_model import DEFAULT_HEIGHT, DEFAULT_STEPS, DEFAULT_WIDTH, weights_path

    meshdit = shutil.which("meshdit")
    meshdit_cmd = [meshdit] if meshdit else [sys.executable, "-m", "meshdit"]
    floor_cmd = [sys.executable, "-c",
                 f"from diffusers import FluxPipeline; FluxPipeline.from_pretrained({str(weights_path())!r})"]
    times: dict[str, list[float]] = {"meshdit": [], "floor": []}
    with tempfile.TemporaryDirectory() as tmp:
        out = str(Path(tmp) / "e2e.png")
        _wall(meshdit_cmd + ["generate", "--prompt", PROMPT, "--output", out])  # warm the page cache
        for i in range(args.rounds):
            times["meshdit"].append(_wall(meshdit_cmd + ["generate", "--prompt", PROMPT, "--output", out]))
            times["floor"].append(_wall(floor_cmd))
            print(f"round {i + 1}/{args.rounds}: meshdit {times['meshdit'][-1]:.2f} s, "
                  f"floor {times['floor'][-1]:.2f} s", file=sys.stderr)
    print("| process | median | min | max |")
    print("|---|---|---|---|")
    for name, label in (("meshdit", f"`meshdit generate --prompt \"{PROMPT}\"` ({DEFAULT_WIDTH}x{DEFAULT_HEIGHT}, "
                                   f"{DEFAULT_STEPS} steps)"),
                        ("floor", "import diffusers + FluxPipeline.from_pretrained, nothing else")):
        values = times[name]
        print(f"| {label} | {statistics.median(values):.2f} s | {min(values):.2f} s | {max(values):.2f} s |")
    added = statistics.median(m - f for m, f in zip(times["meshdit"], times["floor"]))
    print(f"\nmeshdit - floor (median of per-round differences): {added:.2f} s")


if __name__ == "__main__":
    main()
