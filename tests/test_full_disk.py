"""A full file system names itself: at the output path (ENOSPC, the earlier file kept) and as the folder for
temporary files (checked before any rank starts, naming each folder tried and TMPDIR as the fix).

The end-to-end runs fill small tmpfs mounts inside a private mount namespace (`unshare -m`, as root): the
mounts exist only for that one command and vanish with it. They are skipped where that is not permitted."""
import errno
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import meshdit.distributed.launch
import meshdit.preflight
from meshdit.cli import main
from meshdit.errors import ConfigError
from meshdit.output import OutputWriteError, save_images
from meshdit.preflight import check_temp_folder

ROOT = Path(__file__).resolve().parents[1]
IMAGE = np.linspace(0, 1, 32 * 32 * 3, dtype=np.float32).reshape(1, 32, 32, 3)


def _full(monkeypatch, *folders):
    """os.statvfs reports no free space for these folders (what a full file system reports)."""
    real = os.statvfs
    full = {os.path.realpath(f) for f in folders}

    def statvfs(path):
        result = real(path)
        if os.path.realpath(path) in full:
            return os.statvfs_result((result.f_bsize, result.f_frsize, result.f_blocks, 0, 0, *result[5:]))
        return result

    monkeypatch.setattr(os, "statvfs", statvfs)


def test_a_short_write_without_errno_on_a_full_disk_is_called_disk_full(tmp_path, monkeypatch):
    """numpy's save reports a full disk as "N requested and M written", with no errno."""
    path = tmp_path / "out.npy"
    save_images(IMAGE, str(path))
    before = path.read_bytes()

    def short_write(f, array):
        raise OSError("12288 requested and 4096 written")

    monkeypatch.setattr(np, "save", short_write)
    _full(monkeypatch, tmp_path)
    with pytest.raises(OutputWriteError) as info:
        save_images(IMAGE * 0.5, str(path))
    text = str(info.value)
    assert text.startswith(f"cannot write {path}: disk full (ENOSPC: No space left on device; the writer said: "
                           "12288 requested and 4096 written); the earlier "), text
    assert f"the earlier {path} is unchanged; free space on the file system of {tmp_path}" in text
    assert "[Errno" not in text and info.value.errno == errno.ENOSPC
    assert path.read_bytes() == before and os.listdir(tmp_path) == ["out.npy"]


def test_no_usable_temp_folder_is_refused_before_ranks_start_naming_each(tmp_path, monkeypatch, capsys):
    folders = [tmp_path / name for name in ("tmpdir", "tmp", "var-tmp")]
    for folder in folders:
        folder.mkdir()
    monkeypatch.setattr(meshdit.preflight, "temp_folder_candidates",
                        lambda: [(str(folders[0]), f"TMPDIR={folders[0]}"), (str(folders[1]), str(folders[1])),
                                 (str(folders[2]), str(folders[2])), (str(tmp_path / "gone"), "the current folder")])
    monkeypatch.setattr(meshdit.distributed.launch, "launch", lambda *a: pytest.fail("ranks were started"))
    _full(monkeypatch, *folders)
    status = main(["generate", "--output", str(tmp_path / "x.png")])
    err = capsys.readouterr().err
    assert status == 2, err
    assert (f"no folder can hold temporary files: TMPDIR={folders[0]} is full (0 KiB free); {folders[1]} is full "
            f"(0 KiB free); {folders[2]} is full (0 KiB free); the current folder does not exist. Free space in one "
            "of them, or set TMPDIR to a folder with free space") in err, err
    assert sorted(os.listdir(tmp_path)) == ["tmp", "tmpdir", "var-tmp"] and not any(os.listdir(f) for f in folders)


def test_a_full_tmpdir_with_a_usable_fallback_is_a_warning(tmp_path, monkeypatch):
    full, usable = tmp_path / "full", tmp_path / "usable"
    full.mkdir(), usable.mkdir()
    monkeypatch.setattr(meshdit.preflight, "temp_folder_candidates",
                        lambda: [(str(full), f"TMPDIR={full}"), (str(usable), str(usable))])
    _full(monkeypatch, full)
    assert check_temp_folder() == (f"TMPDIR={full} is full (0 KiB free): temporary files go to {usable} instead. "
                                   "Free space there, or set TMPDIR to a folder with free space.")
    monkeypatch.setattr(meshdit.preflight, "temp_folder_candidates", lambda: [(str(usable), str(usable))])
    assert check_temp_folder() is None


def _in_private_mounts(script: str, scratch: Path, timeout: float = 300) -> subprocess.CompletedProcess:
    """Runs a shell script in a mount namespace of its own (mounts made there are seen by nothing else)."""
    (scratch / "probe").mkdir()
    probe = subprocess.run(["unshare", "-m", "sh", "-c", "mount --make-rprivate / && mount -t tmpfs -o size=4k "
                            f"tmpfs {scratch / 'probe'}"], capture_output=True, text=True)
    (scratch / "probe").rmdir()
    if probe.returncode != 0:
        pytest.skip(f"no private mount namespace here (unshare -m, mount): {probe.stderr.strip()}")
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    env.pop("TMPDIR", None)
    return subprocess.run(["unshare", "-m", "sh", "-c", "set -e; mount --make-rprivate /\n" + script],
                          capture_output=True, text=True, timeout=timeout, env=env, cwd=ROOT)


def _fill(folder: str) -> str:
    """Shell lines mounting a 64 KiB tmpfs at `folder` and filling it."""
    return (f"mount -t tmpfs -o size=64k tmpfs {folder}\n"
            f"head -c 1048576 /dev/zero > {folder}/filler 2>/dev/null || true\n")


def _hidden_by_mounts(folders: list[str], needed: list[str]) -> list[str]:
    """Of the paths a command needs, those a mount over one of `folders` would hide."""
    hidden = []
    for path in needed:
        real = os.path.realpath(path)
        if any(real == f or real.startswith(f.rstrip("/") + "/") for f in map(os.path.realpath, folders)):
            hidden.append(path)
    return hidden


def _interpreter_paths() -> list[str]:
    """What `python -m meshdit` needs to start: the interpreter, its environment, the checkout, its imports."""
    return [sys.executable, sys.prefix, sys.base_prefix, str(ROOT)] + [p for p in sys.path if p and os.path.isdir(p)]


def test_a_venv_under_tmp_is_named_as_hidden_by_the_tmp_mount():
    assert _hidden_by_mounts(["/tmp", "/var/tmp"], ["/tmp/venv/bin/python", "/usr/bin/python3", "/tmpx/lib",
                                                    "/var/tmp/site"]) == ["/tmp/venv/bin/python", "/var/tmp/site"]


def test_cli_with_tmp_and_var_tmp_full_names_them_before_ranks_start(tmp_path):
    hidden = _hidden_by_mounts(["/tmp", "/var/tmp"], _interpreter_paths())
    if hidden:  # the test mounts over /tmp and /var/tmp: the interpreter would vanish with them
        pytest.skip(f"the Python environment lives under /tmp or /var/tmp ({hidden[0]}), which this test mounts "
                    "over; run it from an environment elsewhere")
    proc = _in_private_mounts(  # the output goes into the full /tmp of the namespace: it is refused before
        _fill("/tmp") + _fill("/var/tmp") +
        f"cd /tmp\nexport TMPDIR=/var/tmp\n{sys.executable} -m meshdit generate --output /tmp/x.png\n", tmp_path,
        timeout=120)
    assert proc.returncode == 2, proc.stderr
    assert ("meshdit: error: no folder can hold temporary files: TMPDIR=/var/tmp is full (ENOSPC: No space left on "
            "device); /tmp is full (ENOSPC: No space left on device); /var/tmp is full") in proc.stderr, proc.stderr
    assert "set TMPDIR to a folder with free space" in proc.stderr and "Traceback" not in proc.stderr
    assert "rank" not in proc.stderr


def test_cli_output_on_a_full_disk_says_so_and_keeps_the_earlier_file(tmp_path):
    (tmp_path / "tmpdir").mkdir()
    disk = tmp_path / "disk"
    disk.mkdir()
    proc = _in_private_mounts(
        f"mount -t tmpfs -o size=64k tmpfs {disk}\nprintf earlier > {disk}/out.npy\n"
        f"head -c 1048576 /dev/zero > {disk}/filler 2>/dev/null || true\n"
        f"export TMPDIR={tmp_path / 'tmpdir'}\n"
        f"{sys.executable} -m meshdit generate --steps 1 --output {disk}/out.npy || echo status=$?\n"
        f"cat {disk}/out.npy; echo; ls -a {disk}\n", tmp_path)
    assert "status=1" in proc.stdout, proc.stderr
    assert (f"rank 0 failed: OutputWriteError: cannot write {disk}/out.npy: disk full (ENOSPC: No space left on "
            "device") in proc.stderr, proc.stderr
    assert f"the earlier {disk}/out.npy is unchanged; free space on the file system of {disk}" in proc.stderr
    assert "[Errno" not in proc.stderr and "Traceback" not in proc.stderr  # the message alone says it all
    listing = proc.stdout.split("status=1\n", 1)[1]
    assert listing.split() == ["earlier", ".", "..", "filler", "out.npy"], proc.stdout   # no partial file left
    # torch's compile cache folder (made by torch itself, kept between runs) is the only thing there
    assert set(os.listdir(tmp_path / "tmpdir")) <= {"torchinductor_root"} and os.listdir(disk) == []
