"""--layout auto: generate runs the planner's choice and gives serial's image; explicit degrees win; serve and the
Python API take the same choice; nothing fitting is refused naming the smallest world."""
from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest

from meshdit.cli import build_parser, generate_plan, main
from meshdit.config import GenerateRequest
from meshdit.planner.auto import auto_world, plan_layout

CLI = [sys.executable, "-m", "meshdit", "generate"]
CPU = {"MESHDIT_PLAN_DEVICE": "cpu"}  # plan for CPU ranks even where a GPU is visible


@pytest.fixture(autouse=True)
def cpu_world(monkeypatch, tmp_path):
    for key, value in CPU.items():
        monkeypatch.setenv(key, value)
    monkeypatch.setenv("MESHDIT_CALIBRATION", str(tmp_path / "none.json"))  # the preset's defaults, not this host's


def _plan(argv):
    return generate_plan(build_parser().parse_args(["generate", *argv]))


def test_auto_takes_the_planners_layout_for_the_ranks_and_explicit_degrees_win():
    engine, _, _, prediction = _plan(["--layout", "auto", "--ranks", "2"])
    assert engine.config.world_size == 2 and prediction.layout.parallel_config() == engine.config
    assert engine.config.cfg_degree == 2  # the bundled model runs two branches: CFG is the cheapest split
    assert engine.vae.parallel  # the planner's decode
    engine, _, _, prediction = _plan(["--layout", "auto", "--ranks", "4", "--ulysses-degree", "2"])
    assert engine.config.ulysses_degree == 2 and engine.config.world_size == 4
    engine, _, _, prediction = _plan(["--ulysses-degree", "2"])
    assert prediction is None and engine.config.ulysses_degree == 2


def test_auto_defaults_to_one_cpu_rank_and_to_torchrun_world(monkeypatch):
    assert auto_world(None).size == 1
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "4")
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "2")
    world = auto_world(None)
    assert (world.gpus_per_node, world.nodes) == (2, 2)
    with pytest.raises(Exception, match="--ranks 3 but torchrun started 4 ranks"):
        auto_world(3)


def test_python_api_returns_the_planners_parallel_config():
    config = plan_layout("flux1-dev", GenerateRequest(prompt="p"), world=__import__(
        "meshdit.planner.hardware", fromlist=["PRESETS"]).PRESETS["h100-sxm"].with_size(4))
    assert config.world_size == 4 and config.cfg_degree == 1  # FLUX.1-dev is guidance-distilled
    assert config.ulysses_degree * config.ring_degree * config.pipefusion_parallel_degree == 4


def test_serve_takes_the_same_choice():
    from meshdit.serve.command import serve_settings

    settings = serve_settings(build_parser().parse_args(["serve", "--layout", "auto", "--ranks", "2"]))
    assert settings.engine.config.world_size == 2


def test_nothing_fits_is_refused_naming_the_smallest_world(capsys):
    rc = main(["generate", "--layout", "auto", "--model", "flux1-dev", "--ranks", "1", "--steps", "1"])
    assert rc == 2
    err = capsys.readouterr().err
    assert "--layout auto: no layout of 1 rank(s)" in err and "use a machine with more memory" in err
    from meshdit.planner.choose import auto_config
    from meshdit.planner.hardware import world_from

    with pytest.raises(Exception, match=r"smallest world in which one fits has \d+ ranks: use --ranks \d+"):
        auto_config("flux1-dev", GenerateRequest(prompt="p"), world_from("h100-sxm", 1, 1, "3GB"))


def test_ranks_without_auto_is_refused(capsys):
    assert main(["generate", "--ranks", "2"]) == 2
    assert "--ranks sets the world --layout auto plans for" in capsys.readouterr().err


def test_generate_auto_gives_serials_image(tmp_path):
    """The planner's choice for 2 ranks runs and equals a one-process run of the same seed."""
    common = ["--prompt", "a red circle", "--steps", "2", "--seed", "3"]
    env = {**os.environ, **CPU, "MESHDIT_CALIBRATION": str(tmp_path / "none.json"), "OMP_NUM_THREADS": "1"}
    serial, auto = tmp_path / "serial.npy", tmp_path / "auto.npy"
    for extra, out in (([], serial), (["--layout", "auto", "--ranks", "2"], auto)):
        proc = subprocess.run(CLI + common + extra + ["--output", str(out)], capture_output=True, text=True,
                              timeout=300, env=env)
        assert proc.returncode == 0, proc.stderr
    assert "--layout auto chose cfg2" in proc.stdout and "the planner predicted" in proc.stdout
    a, b = np.load(serial), np.load(auto)
    assert np.abs(a - b).max() <= 1e-5
