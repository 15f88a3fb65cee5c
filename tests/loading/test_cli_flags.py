"""The loading flags, and `meshdit generate` on a truncated checkpoint: every rank exits non-zero, naming the file."""
import os
import shutil
import subprocess
import sys
import time

import pytest

from meshdit.cli import build_parser
from meshdit.flags import engine_settings_from_args


@pytest.mark.parametrize("argv, efficient, encoder_device", [
    ([], None, None),
    (["--no-memory-efficient-load"], False, None),
    (["--memory-efficient-load", "--text-encoder-device", "cpu"], True, "cpu"),
    (["--memory_efficient_replicated_load"], True, None),
])
def test_flags(argv, efficient, encoder_device):
    options = engine_settings_from_args(build_parser().parse_args(["generate", *argv])).loading
    assert options.memory_efficient is efficient and options.text_encoder_device == encoder_device
    assert options.efficient(2) is (efficient is not False) and options.efficient(1) is bool(efficient)


def test_truncated_weights_end_every_rank_naming_the_file(flux_folder, tmp_path):
    folder = tmp_path / "model"
    shutil.copytree(flux_folder, folder)
    weights = folder / "transformer" / "diffusion_pytorch_model.safetensors"
    os.truncate(weights, os.path.getsize(weights) // 2)
    start = time.monotonic()
    proc = subprocess.run([sys.executable, "-m", "meshdit", "generate", "--model", str(folder), "--height", "32",
                           "--width", "32", "--steps", "2", "--ulysses-degree", "2", "--output",
                           str(tmp_path / "x.png")], capture_output=True, text=True, timeout=240)
    seconds = time.monotonic() - start
    assert proc.returncode != 0
    assert str(weights) in proc.stderr and "truncated" in proc.stderr, proc.stderr[-2000:]
    # ~10 s on an idle 2-core machine, nearly all of it each rank importing torch and diffusers (86 s
    # seen with 20 other processes on the 2 cores); a hang would last the collective timeout (300 s).
    assert seconds < 180
    assert not (tmp_path / "x.png").exists()
