"""The README's "Your diffusers script, over the mesh" runs as written on 2 ranks under torchrun and saves the image
the same script without its two meshdit lines saves in one process."""
from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np

from meshdit.distributed.ports import free_port

ROOT = Path(__file__).resolve().parents[2]
MESHDIT_LINES = ("import meshdit", "meshdit.parallelize(")


def readme_script() -> str:
    section = ROOT.joinpath("README.md").read_text().split("## Your diffusers script, over the mesh", 1)[1]
    return re.search(r"```python\n(.*?)```", section, re.S).group(1)


def run(command: list[str], cwd: Path) -> None:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT), "TMPDIR": str(cwd)}
    proc = subprocess.run(command, cwd=cwd, capture_output=True, text=True, timeout=300, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]


def test_readme_script_on_two_ranks_equals_one_process(tmp_path):
    script = readme_script()
    assert sum(line.startswith(MESHDIT_LINES) for line in script.splitlines()) == 2  # the two-line change
    plain = "\n".join(line for line in script.splitlines() if not line.startswith(MESHDIT_LINES)) + "\n"
    (tmp_path / "my_flux.py").write_text(script)
    (tmp_path / "plain_flux.py").write_text(plain)
    run([sys.executable, "-m", "meshdit.testing.save_tiny", "flux", "tiny-flux"], tmp_path)
    run([sys.executable, "plain_flux.py"], tmp_path)
    one_process = np.asarray(_load(tmp_path / "cat.png"), dtype=np.int16)
    (tmp_path / "cat.png").unlink()
    run([sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "--master-addr", "127.0.0.1",
         "--master-port", str(free_port()), "my_flux.py"], tmp_path)
    two_ranks = np.asarray(_load(tmp_path / "cat.png"), dtype=np.int16)
    assert two_ranks.shape == one_process.shape == (256, 256, 3)  # FluxPipeline's default size
    # 8-bit PNGs of float images equal to 1e-6: a value on a rounding edge may land one level apart
    assert np.abs(two_ranks - one_process).max() <= 1


def _load(path: Path):
    from PIL import Image

    with Image.open(path) as image:
        return image.convert("RGB").copy()
