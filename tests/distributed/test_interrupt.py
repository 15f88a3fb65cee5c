"""Ctrl-C at each phase of a 2-rank `meshdit generate` (start-up, loading, compiling, denoising, decoding): every
rank ends within 5 s, exit status 130, one line saying so, no traceback, nothing left behind (no process of
the run, nothing in its TMPDIR, no output). SIGINT goes to the whole process group, as a terminal sends it.
Loading and decoding are held by MESHDIT_HOLD_PHASE (meshdit/phases.py); the others are slow by themselves."""
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

from .cli_process import ROOT, files_left, finish, processes_left, read_until, start_cli

LIMIT_S = 5.0
SLOW_IMPORT = Path(__file__).parent / "slow_import"


def _rank_processes(launcher: int) -> list[int]:
    found = subprocess.run(["pgrep", "-f", "-P", str(launcher), "spawn_main"], capture_output=True, text=True)
    return [int(pid) for pid in found.stdout.split()]


def _interrupt_and_check(proc, tmp_path, out, seen: str):
    os.killpg(proc.pid, signal.SIGINT)  # what the terminal sends to the whole foreground group
    sent = time.monotonic()
    rc, _, err = finish(proc, 60)
    left = processes_left(proc, wait=LIMIT_S)
    seconds = time.monotonic() - sent
    err = seen + err
    assert left == "", f"processes left after Ctrl-C:\n{left}"
    assert seconds <= LIMIT_S, f"the run ended {seconds:.1f} s after Ctrl-C\n{err[-3000:]}"
    assert rc == 130, err[-3000:]
    assert "Traceback" not in err and "KeyboardInterrupt" not in err, err[-6000:]
    messages = [line for line in err.splitlines() if "interrupt" in line.lower()]
    assert messages == ["meshdit: interrupted; all ranks stopped"], err[-3000:]
    assert files_left(tmp_path) == [] and not out.exists()


def _args(model, out, *extra):
    return ["--model", model, "--height", "32", "--width", "32", "--ring-degree", "2", "--output", str(out), *extra]


def test_ctrl_c_during_start_up(tiny_flux_dir, tmp_path):
    """While the ranks import torch, before they join the world: an interrupted import must not end in a
    rank's traceback. The import is held part-way (tests/distributed/slow_import), after torch.distributed
    and before torch is whole, where a rank once tried to import torch again to leave its world."""
    out, marks = tmp_path / "x.png", tmp_path / "importing"
    marks.mkdir()
    proc = start_cli(_args(tiny_flux_dir, out, "--steps", "2"), tmp_path,
                     PYTHONPATH=f"{SLOW_IMPORT}{os.pathsep}{ROOT}",
                     MESHDIT_TEST_SLOW_IMPORT=f"torch.distributed.rpc:{marks}")
    deadline = time.monotonic() + 120
    while len(set(os.listdir(marks)) & {str(pid) for pid in _rank_processes(proc.pid)}) < 2:
        assert proc.poll() is None and time.monotonic() < deadline, "the ranks did not start importing torch"
        time.sleep(0.05)
    _interrupt_and_check(proc, tmp_path, out, "")


@pytest.mark.parametrize("hold", ["loading", "decoding", "loading:native"])
def test_ctrl_c_during_a_held_phase(tiny_flux_dir, tmp_path, hold):
    """loading:native holds both ranks inside native calls Python cannot interrupt: they are killed."""
    out, phase = tmp_path / "x.png", hold.split(":")[0]
    proc = start_cli(_args(tiny_flux_dir, out, "--steps", "2"), tmp_path, MESHDIT_HOLD_PHASE=hold)
    seen = read_until(proc, "rank 1 holding", 180)
    seen += read_until(proc, "rank 0 holding", 30) if "rank 0 holding" not in seen else ""
    assert f"rank 0 holding in phase {phase}" in seen and f"rank 1 holding in phase {phase}" in seen, seen
    time.sleep(0.5)
    _interrupt_and_check(proc, tmp_path, out, seen)


def test_ctrl_c_during_denoising(tiny_flux_dir, tmp_path):
    out = tmp_path / "x.png"
    proc = start_cli(_args(tiny_flux_dir, out, "--steps", "10000"), tmp_path)  # the most --steps takes
    seen = read_until(proc, "/10000", 180)
    assert "denoising" in seen, seen
    _interrupt_and_check(proc, tmp_path, out, seen)


def test_compiling_is_shown_as_its_own_phase_and_ctrl_c_stops_it(tiny_flux_dir, tmp_path):
    out = tmp_path / "x.png"
    proc = start_cli(_args(tiny_flux_dir, out, "--steps", "2", "--compile", "inductor"), tmp_path)
    seen = read_until(proc, "compiling the transformer blocks with torch.compile (inductor)", 180)
    assert "meshdit: compiling the transformer blocks with torch.compile (inductor) in the first step" in seen, seen
    time.sleep(1.0)   # into the compilation, which takes tens of seconds here
    assert "1/2" not in seen + read_until(proc, "1/2", 0.5), "compiling ended before the test could interrupt it"
    _interrupt_and_check(proc, tmp_path, out, seen)


def test_ctrl_c_of_one_rank_inside_a_long_native_call(tiny_flux_dir, tmp_path):
    """One rank runs in the launcher's process; it is held inside native matrix products of seconds each
    (as a huge request's attention call), which Python cannot interrupt until they return."""
    out = tmp_path / "x.png"
    proc = start_cli(["--model", tiny_flux_dir, "--height", "32", "--width", "32", "--steps", "2", "--output",
                      str(out)], tmp_path, MESHDIT_HOLD_PHASE="loading:native")
    seen = read_until(proc, "rank 0 holding in phase loading", 180)
    assert "rank 0 holding in phase loading" in seen, seen
    time.sleep(0.5)   # inside the first product
    _interrupt_and_check(proc, tmp_path, out, seen)
