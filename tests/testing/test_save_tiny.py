"""The README's "Video, offline" (and docs/video.md's "Try video offline"): its commands, exactly as written, run offline in under a minute each,
and Wan's default size on the tiny model is a pre-flight ConfigError naming the size rule."""
import os
import re
import shutil
import subprocess
import sys
import time

import numpy as np
import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _commands(path: str, heading: str) -> list[str]:
    section = open(os.path.join(ROOT, path), encoding="utf-8").read().split(heading, 1)[1]
    return re.search(r"```bash\n(.*?)```", section, re.S).group(1).strip().splitlines()


def documented_commands() -> list[str]:
    """The README's commands, which docs/video.md repeats word for word."""
    commands = _commands("README.md", "### Video, offline")
    assert commands == _commands(os.path.join("docs", "video.md"), "## Try video offline")
    return commands


def run(command: str, cwd, timeout=120):
    if shutil.which(command.split()[0]) is None:  # not installed on PATH: the same module through python
        command = command.replace("meshdit ", f"{sys.executable} -m meshdit ", 1)
    command = command.replace("python ", f"{sys.executable} ", 1) if command.startswith("python ") else command
    env = {**os.environ, "PYTHONPATH": ROOT, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    start = time.monotonic()
    proc = subprocess.run(command, shell=True, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    return proc, time.monotonic() - start


@pytest.fixture(scope="module")
def tiny_wan(tmp_path_factory):
    """Runs the documented save command; returns (its folder's parent, seconds)."""
    save = documented_commands()[0]
    cwd = tmp_path_factory.mktemp("offline")
    proc, seconds = run(save, cwd)
    assert proc.returncode == 0, proc.stderr
    return cwd, seconds


def test_documented_offline_video_commands_run_in_under_a_minute(tiny_wan):
    import imageio.v3 as iio

    cwd, save_seconds = tiny_wan
    save, generate = documented_commands()
    assert save.startswith("python -m meshdit.testing.save_tiny ") and generate.startswith("meshdit generate ")
    proc, seconds = run(generate, cwd)
    assert proc.returncode == 0, proc.stderr
    assert save_seconds < 60 and seconds < 60, (save_seconds, seconds)
    frames = iio.imread(cwd / "clip.mp4")  # [F, H, W, 3]
    assert frames.shape == (9, 64, 64, 3) and np.ptp(frames) > 0


def test_a_size_the_tiny_video_model_cannot_take_is_refused_before_ranks_start(tiny_wan):
    cwd, _ = tiny_wan
    proc, _ = run("meshdit generate --model tiny-wan --steps 1 --ulysses-degree 2 --output wide.mp4", cwd)
    assert proc.returncode == 2, proc.stderr
    assert ("480x832 gives 30 x 52 tokens, more per side than this model's rotary table covers (32 positions per "
            "axis, its transformer's rope_max_seq_len): use --height and --width <= 512.") in proc.stderr
    assert "Traceback" not in proc.stderr and not (cwd / "wide.mp4").exists()
    proc, _ = run("meshdit generate --model tiny-wan --height 64 --width 64 --num-frames 141 --output long.mp4", cwd)
    assert proc.returncode == 2 and "36 latent frames" in proc.stderr and "--num-frames <= 125" in proc.stderr, \
        proc.stderr


def test_save_refuses_a_folder_that_is_not_empty(tmp_path):
    (tmp_path / "keep.txt").write_text("mine")
    proc, _ = run(f"python -m meshdit.testing.save_tiny wan {tmp_path}", tmp_path)
    assert proc.returncode == 2 and "not an empty folder" in proc.stderr
    assert os.listdir(tmp_path) == ["keep.txt"]
