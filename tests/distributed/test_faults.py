"""Injected faults end cleanly: named, printed once, nothing silently wrong, nothing left behind.

Bounded (every subprocess has a timeout) and loopback only. Faults: a rank that raises,
a rank that freezes (SIGSTOP), SIGTERM and SIGKILL to the launcher, two runs sharing an
exported MASTER_PORT, a write that fails (disk full, file size limit), a model that fails to
load with one rank. Each run gets its own TMPDIR, checked empty afterwards.
"""
import errno
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import numpy as np
import pytest

from meshdit.output import OutputWriteError, check_output_path, save_images
from meshdit.errors import ConfigError
from tests.distributed.cli_process import finish

ROOT = Path(__file__).resolve().parents[2]

# What the cli does with a launch (meshdit.cli.main), for entries from rank_entries.py.
DRIVER = textwrap.dedent("""
    import sys
    from meshdit.distributed.launch import launch
    from meshdit.errors import RankFailedError
    from tests.distributed import rank_entries
    try:
        launch(getattr(rank_entries, sys.argv[1]), sys.argv[3], int(sys.argv[2]))
    except RankFailedError as exc:
        print(f"meshdit: error: {exc}", file=sys.stderr)
        sys.exit(1)
    except KeyboardInterrupt:
        print("meshdit: interrupted; all ranks stopped", file=sys.stderr)
        sys.exit(130)
""")


def _env(tmp: Path, **extra) -> dict:
    (tmp / "tmpdir").mkdir(exist_ok=True)
    return {**os.environ, "PYTHONPATH": str(ROOT), "TMPDIR": str(tmp / "tmpdir"), "OMP_NUM_THREADS": "1", **extra}


def _start(entry: str, world: int, arg: str, env: dict) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", DRIVER, entry, str(world), arg], cwd=ROOT, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)


def _finish(proc: subprocess.Popen, timeout: float) -> tuple[int, str]:
    code, _, err = finish(proc, timeout)
    return code, err


def _assert_nothing_left(proc: subprocess.Popen, tmp: Path, stderr: str) -> None:
    """No process of the run's session, nothing in its TMPDIR, no leaked-semaphore warning."""
    deadline = time.monotonic() + 10
    while True:
        left = subprocess.run(["pgrep", "-a", "-s", str(proc.pid)], capture_output=True, text=True).stdout
        if not left or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    assert left == ""
    assert list((tmp / "tmpdir").iterdir()) == []          # no meshdit-failures-*, pytorch-errorfile-*
    assert "leaked semaphore" not in stderr


def test_failing_rank_is_printed_once_with_the_others_on_one_line(tmp_path):
    proc = _start("fail_on_rank_1", 3, "", _env(tmp_path))
    rc, err = _finish(proc, 120)
    assert rc == 1, err
    assert err.count("Traceback") == 1, err
    assert "meshdit: error: rank 1 failed: ValueError: injected failure on rank 1" in err
    others = [line for line in err.splitlines() if line.startswith("other ranks: ")]
    assert len(others) == 1 and "rank 0 " in others[0] and "rank 2 " in others[0], err
    _assert_nothing_left(proc, tmp_path, err)


def test_frozen_rank_is_named_within_seconds_of_the_heartbeat_timeout(tmp_path):
    timeout = 3.0
    proc = _start("freeze_rank_1_at", 2, str(tmp_path / "stopped"), _env(tmp_path, MESHDIT_HEARTBEAT_TIMEOUT="3"))
    rc, err = _finish(proc, 120)
    noticed = time.time()
    assert rc == 1, err
    assert "rank 1 stopped responding: no heartbeat" in err and "Silent: rank 1;" in err, err
    after = noticed - float((tmp_path / "stopped").read_text())   # rank 1 wrote when it stopped itself
    assert after < timeout + 4, f"frozen rank named {after:.1f} s after it stopped"
    _assert_nothing_left(proc, tmp_path, err)


def _wait_for_files(paths, proc, timeout=90):
    deadline = time.monotonic() + timeout
    while not all(p.exists() and p.read_text() for p in paths):
        assert proc.poll() is None and time.monotonic() < deadline, "ranks did not start"
        time.sleep(0.1)
    return [int(p.read_text()) for p in paths]


def _gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return Path(f"/proc/{pid}/stat").read_text().split()[2] == "Z"


def test_sigterm_to_the_launcher_stops_every_rank_like_ctrl_c(tmp_path):
    proc = _start("sleep_forever", 2, str(tmp_path / "pid"), _env(tmp_path))
    pids = _wait_for_files([tmp_path / "pid.0", tmp_path / "pid.1"], proc)
    proc.send_signal(signal.SIGTERM)
    rc, err = _finish(proc, 20)
    assert rc == 130, err
    assert "Traceback" not in err and "interrupted; all ranks stopped" in err
    assert all(_gone(pid) for pid in pids)
    _assert_nothing_left(proc, tmp_path, err)


def test_ranks_exit_on_their_own_when_the_launcher_is_killed(tmp_path):
    proc = _start("sleep_forever", 2, str(tmp_path / "pid"), _env(tmp_path, MESHDIT_HEARTBEAT_TIMEOUT="1"))
    pids = _wait_for_files([tmp_path / "pid.0", tmp_path / "pid.1"], proc)
    proc.kill()
    _, err = _finish(proc, 20)
    deadline = time.monotonic() + 5   # a rank notices at its next heartbeat (every timeout / 5)
    while not all(_gone(pid) for pid in pids) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert all(_gone(pid) for pid in pids), "ranks outlived their launcher"
    _assert_nothing_left(proc, tmp_path, err)


def test_two_runs_with_the_same_exported_master_port_both_succeed(tmp_path):
    env = _env(tmp_path, MASTER_PORT="29555", MASTER_ADDR="127.0.0.1")
    runs = [_start("all_reduce_and_report_port", 2, str(tmp_path / f"run{k}"), env) for k in range(2)]
    results = [_finish(proc, 120) for proc in runs]
    assert [rc for rc, _ in results] == [0, 0], results
    ports = []
    for k in range(2):
        seen = {(tmp_path / f"run{k}.{r}").read_text() for r in range(2)}
        assert len(seen) == 1                                   # one world per run
        port, total = seen.pop().split()
        assert total == "2" and port != "29555"                 # a free port of its own, not the exported one
        ports.append(port)
    assert ports[0] != ports[1]
    for proc, (_, err) in zip(runs, results):
        _assert_nothing_left(proc, tmp_path, err)


IMAGE = np.linspace(0, 1, 32 * 32 * 3, dtype=np.float32).reshape(1, 32, 32, 3)


def test_output_name_is_exactly_the_one_given(tmp_path):
    assert save_images(IMAGE, str(tmp_path / "x.NPY")) == [str(tmp_path / "x.NPY")]
    assert os.listdir(tmp_path) == ["x.NPY"]
    np.testing.assert_array_equal(np.load(tmp_path / "x.NPY"), IMAGE[0])


def test_disk_full_keeps_the_earlier_output_and_says_so(tmp_path, monkeypatch):
    path = tmp_path / "out.npy"
    save_images(IMAGE, str(path))
    before = path.read_bytes()

    def full_disk(f, array):  # a write that gets half way, then ENOSPC (as a full disk does)
        f.write(b"\x93NUMPY" + b"\0" * 100)
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(np, "save", full_disk)
    with pytest.raises(OutputWriteError, match=f"disk full.*the earlier {path} is unchanged"):
        save_images(IMAGE * 0.5, str(path))
    assert path.read_bytes() == before and os.listdir(tmp_path) == ["out.npy"]


def test_file_size_limit_keeps_the_earlier_output(tmp_path):
    """A real failing write: RLIMIT_FSIZE below the image's size (SIGXFSZ ignored, so write() fails)."""
    path = tmp_path / "out.png"
    save_images(IMAGE, str(path))
    before = path.read_bytes()
    script = textwrap.dedent(f"""
        import resource, signal, numpy as np
        from meshdit.output import save_images
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (1000, 1000))
        rng = np.random.default_rng(0)
        save_images(rng.random((1, 64, 64, 3)), {str(path)!r})   # noise: a PNG of ~12 KB
    """)
    proc = subprocess.run([sys.executable, "-c", script], cwd=ROOT, env=_env(tmp_path), capture_output=True,
                          text=True, timeout=60)
    assert proc.returncode == 1 and "OutputWriteError" in proc.stderr and "file size limit" in proc.stderr
    assert path.read_bytes() == before and sorted(os.listdir(tmp_path)) == ["out.png", "tmpdir"]


@pytest.mark.parametrize("make, fix", [
    (lambda t: (t / "a_dir.png").mkdir(), "is a directory"),
    (lambda t: (t / "file").write_text("x"), "is a file, not a folder"),
])
def test_unwritable_output_is_refused_before_ranks_start(tmp_path, make, fix):
    make(tmp_path)
    pattern = str(tmp_path / "a_dir.png") if "directory" in fix else str(tmp_path / "file" / "sub" / "x.png")
    with pytest.raises(ConfigError, match=fix):
        check_output_path(pattern, 1)


def _load_fails(_):
    try:
        raise FileNotFoundError("transformer/diffusion_pytorch_model.safetensors")
    except FileNotFoundError as exc:
        raise ConfigError("could not load the pipeline: weights missing") from exc


def test_one_rank_failure_is_one_error_with_one_traceback():
    """With one rank the rank runs in the launcher's process: its error is wrapped (the cli prints
    'meshdit: error: ' + it), not printed by the rank and again by Python."""
    from meshdit.distributed.launch import launch
    from meshdit.errors import RankFailedError

    before = {k: os.environ.get(k) for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_PORT")}
    with pytest.raises(RankFailedError) as info:
        launch(_load_fails, None, 1)
    text = str(info.value)
    assert text.startswith("rank 0 failed: ConfigError: could not load the pipeline: weights missing\n")
    assert text.count("Traceback") == 1 and "_load_fails" in text
    assert {k: os.environ.get(k) for k in before} == before   # a later launch spawns ranks again


def test_library_import_warnings_stay_out_of_quiet_runs(tmp_path):
    script = ("from meshdit.logs import quiet_libraries; quiet_libraries(False); "
              "from transformers import CLIPImageProcessor")   # warns that torchvision is missing, unless quiet
    proc = subprocess.run([sys.executable, "-W", "default", "-c", script], cwd=ROOT, env=_env(tmp_path),
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0 and "torchvision" not in proc.stderr and "[transformers]" not in proc.stderr, \
        proc.stderr
