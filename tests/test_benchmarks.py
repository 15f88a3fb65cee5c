"""The benchmark runner in --quick mode: every section is written, and the bytes each method
sends per step match its formula (deterministic, so it can be a test; speed is never asserted)."""
import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SECTIONS = ("meta", "overhead", "scaling", "communication", "memory", "gpu")


@pytest.fixture(scope="module")
def quick_results(tmp_path_factory):
    out = tmp_path_factory.mktemp("bench")
    proc = subprocess.run([sys.executable, "-m", "benchmarks.run", "--quick", "--out", str(out)], cwd=ROOT,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return out, json.loads((out / "latest.json").read_text())


def test_every_section_and_file(quick_results):
    out, r = quick_results
    assert set(SECTIONS) <= set(r)
    assert (out / "latest.md").read_text().count("## ") >= 6
    assert "Efficiency = speedup / ceiling" in (out / "latest.md").read_text()
    assert (out / "latest.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert r["overhead"]["max_abs_image_diff"] == 0.0, "meshdit with degrees 1 must draw the diffusers image"
    assert r["overhead"]["ratio"] > 0
    for case in r["scaling"]["cases"]:
        assert {"ulysses2", "ring2"} <= set(case["methods"]), case.get("skipped")
        # the ceiling is measured for every baseline a method is compared with, and every row has its efficiency
        assert {e["baseline"] for e in case["methods"].values()} <= set(case["ceiling"])
        assert all(value > 0 for value in case["ceiling"].values())
        for name, e in case["methods"].items():
            for impl in ("meshdit", "diffusers"):
                if impl in e:
                    assert e[impl]["efficiency"] == e[impl]["speedup"] / case["ceiling"][e["baseline"]]
        for name in ("ulysses2", "ring2"):
            for impl in ("meshdit", "diffusers"):  # both sides measured, both exact
                entry = case["methods"][name][impl]
                assert entry["speedup"] > 0
                assert entry["max_abs_diff_vs_serial"] < 1e-4
    for case in r["memory"]["cases"]:
        assert case["rows"]["serial/forward"][0]["peak_activation_bytes"] > 0
        for label, per_rank in case["rows"].items():
            for row in per_rank:
                if row:
                    assert row["param_bytes"] > 0 and row["peak_activation_bytes"] > 0, label
    assert "skipped" in r["gpu"] or r["gpu"]["max_abs_image_diff"] is not None


def test_measured_bytes_match_formula(quick_results):
    _, r = quick_results
    checked = 0
    for case in r["communication"]["cases"]:
        for name, impls in case["methods"].items():
            for impl, v in impls.items():
                if v["formula_bytes"] is None:
                    continue
                formulas = v["formula_bytes"]  # one for every rank, or one per rank (PipeFusion's stages)
                for rank, measured in enumerate(v["measured_bytes_per_rank"]):
                    formula = formulas[rank] if isinstance(formulas, list) else formulas
                    assert abs(measured / formula - 1) <= 0.10, (case["image_tokens"], name, impl, rank, v)
                checked += 1
    assert checked >= 2 * 6  # ulysses2, ring2 (meshdit and diffusers), cfg2, pipefusion2 at each quick size
    assert all("pipefusion2" in case["methods"] for case in r["communication"]["cases"])


def test_end_to_end_benchmark_times_both_processes():
    """One round of `python -m benchmarks.end_to_end`: both rows are printed with their times (never asserted)."""
    proc = subprocess.run([sys.executable, "-m", "benchmarks.end_to_end", "--rounds", "1"], cwd=ROOT,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    rows = [line for line in proc.stdout.splitlines() if line.startswith("| ") and " s |" in line]
    assert len(rows) == 2 and "meshdit generate" in rows[0] and "FluxPipeline.from_pretrained" in rows[1]
    for row in rows:
        median = float(row.split("|")[2].strip().removesuffix(" s"))
        assert median > 0
    assert "meshdit - floor" in proc.stdout


def test_video_scaling_quick_run_writes_every_file_and_parallel_equals_serial(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "benchmarks.video_scaling", "--quick", "--out", str(tmp_path)],
                          cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    r = json.loads((tmp_path / "video_scaling_quick.json").read_text())
    assert [row["tokens"] for row in r["rows"]] == [256, 512]
    for row in r["rows"]:
        assert {"ulysses2/meshdit", "ring2/meshdit"} <= set(row["methods"]) and row["ceiling"] > 0
        assert all(m["relative_diff"] < 1e-5 for m in row["methods"].values()), row  # exact methods stay exact
    assert (tmp_path / "video_scaling_quick.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "| 256 |" in (tmp_path / "video_scaling_quick.md").read_text()


def test_cost_growth_curves_and_chart(tmp_path):
    """benchmarks.cost_growth turns the runner's sections into per-token curves (the ceiling line is serial
    seconds / ceiling speedup) and draws them; its full run is the lead's to make (minutes)."""
    from benchmarks.cost_growth import curves, write_png

    scaling = {"cases": [{"image_tokens": t, "median_seconds": {"serial/forward": 2.0 * t},
                          "ceiling": {"serial/forward": 1.6},
                          "methods": {"ulysses2": {"meshdit": {"median_seconds": 1.5 * t}}}} for t in (256, 1024)]}
    comm = {"cases": [{"image_tokens": t, "methods": {"ulysses2": {"meshdit": {"measured_bytes_per_rank": [t, 2 * t]}}}}
                      for t in (256, 1024)]}
    times, sent = curves(scaling, comm)
    assert times["serial/forward"] == [(256, 512.0), (1024, 2048.0)]
    assert times["ceiling/forward"] == [(256, 320.0), (1024, 1280.0)]
    assert times["ulysses2"] == [(256, 384.0), (1024, 1536.0)]
    assert sent["ulysses2"] == [(256, 512), (1024, 2048)]
    write_png(times, sent, tmp_path / "c.png", "test")
    assert (tmp_path / "c.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_flux_dev_compile_comparison_path_runs_on_a_tiny_model():
    """The FLUX.1-dev GPU compile comparison (benchmarks.compile --flux-dev), run on its shrunken CPU model."""
    from benchmarks.compile import flux_dev_compile

    r = flux_dev_compile(steps=1, rounds=1, backend="eager", tiny=True)
    # timings of a milliseconds-long step on a shared CPU are noise (a difference of two may be < 0): only the
    # path, the size and the exactness of the eager backend (it runs the traced graphs) are checked here
    assert r["px"] == 64 and all(math.isfinite(r[k]) for k in ("eager_step_s", "compiled_step_s", "compile_s"))
    assert r["max_abs_diff"] == 0.0
