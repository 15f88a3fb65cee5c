"""A request's memory and time are judged before any rank starts by the planner's cost model (meshdit/request_cost.py
over planner/predict.py: one memory model for `meshdit plan`, `--layout auto` and this check). A request whose
predicted memory exceeds what the ranks can get is refused, naming the largest size that fits and --force; one that
will take very long is warned about, naming the predicted time."""
import json
import re

import pytest

import meshdit.distributed.launch
from meshdit.cli import build_parser, generate_plan, generate_settings, main
from meshdit.planner.hardware import world_from
from meshdit.planner.layouts import layout_of
from meshdit.planner.model_costs import costs_of
from meshdit.planner.predict import predict
from meshdit.request_cost import GIB, estimate, machine, warning


@pytest.fixture
def launched(monkeypatch, tmp_path):
    """The launches main() makes, recorded instead of run; this machine uncalibrated, with 16 GiB available."""
    calls = []
    monkeypatch.setattr(meshdit.distributed.launch, "launch", lambda entry, job, world: calls.append(job))
    monkeypatch.setattr("meshdit.request_cost.available_memory", lambda device: 16 * GIB)
    monkeypatch.setenv("MESHDIT_CALIBRATION", str(tmp_path / "none.json"))
    monkeypatch.setenv("MESHDIT_PLAN_DEVICE", "cpu")
    return calls


def _cost(argv, available=None, device="cpu"):
    args = build_parser().parse_args(["generate", *argv])
    engine, info, request = generate_settings(args)
    return estimate(engine, info, request, device, available), request, info


def test_8192_square_that_cannot_fit_is_refused_naming_the_size_that_fits_and_force(tmp_path, launched, capsys):
    out = str(tmp_path / "x.png")
    assert main(["generate", "--height", "8192", "--width", "8192", "--output", out]) == 2
    err = capsys.readouterr().err
    assert launched == [] and err.startswith("meshdit: error: 8192x8192 needs about 16.1 GB of RAM"), err
    for shown in ("16.1 GB of it for the VAE decode", "(90% of the 17.2 GB available now", "--force",
                  "--vae-tile-height 1024"):
        assert shown in err, (shown, err)
    height, width = map(int, re.search(r"fits is --height (\d+) --width (\d+)", err).groups())
    assert height == width and 7000 < height < 8192 and height % 16 == 0
    # the size it names starts (with the time warning), and so does the refused one under --force
    assert main(["generate", "--height", str(height), "--width", str(width), "--output", out]) == 0
    assert main(["generate", "--height", str(height + 16), "--width", str(width + 16), "--output", out]) == 2
    capsys.readouterr()
    assert main(["generate", "--height", "8192", "--width", "8192", "--output", out, "--force"]) == 0
    err = capsys.readouterr().err
    assert len(launched) == 2 and "it needs about 16.1 GB of RAM" in err and "error" not in err


def test_a_very_long_request_names_its_predicted_time_and_says_to_calibrate(tmp_path, launched, capsys):
    assert main(["generate", "--height", "4096", "--width", "4096", "--output", str(tmp_path / "x.png")]) == 0
    err = capsys.readouterr().err
    warnings = [line for line in err.splitlines() if line.startswith("meshdit: warning: this request is heavy")]
    assert len(warnings) == 1 and len(launched) == 1, err
    for shown in ("4096x4096 is 65,536 image tokens (the model's default 256x256: 256)", "times the work",
                  "predicted to take 44.7 h", "`meshdit plan --calibrate`", "fewer --steps"):
        assert shown in warnings[0], (shown, warnings[0])


def test_the_default_request_and_a_modest_one_get_no_warning(tmp_path, launched, capsys):
    for size in ([], ["--height", "512", "--width", "512"]):
        assert main(["generate", *size, "--output", str(tmp_path / "x.png")]) == 0
        assert "heavy" not in capsys.readouterr().err
    assert len(launched) == 2


def test_one_memory_model_for_the_check_the_planner_and_layout_auto(launched):
    """--layout auto --ranks 1 at 8192^2 printed 16 GB peak while the heavy-request check said 49.5 GiB: both are
    now the planner's prediction, for any layout given."""
    args = build_parser().parse_args(["generate", "--layout", "auto", "--ranks", "1", "--height", "8192",
                                      "--width", "8192"])
    engine, info, request, chosen = generate_plan(args)
    cost = estimate(engine, info, request, "cpu", 64 * GIB)
    assert cost.memory_bytes == chosen.node_bytes == chosen.memory.peak and cost.decode_bytes == chosen.memory.vae
    for argv in (["--height", "2048", "--width", "2048", "--ulysses-degree", "2"],
                 ["--pipefusion-parallel-degree", "2", "--use-parallel-vae", "--height", "1024", "--width", "1024"],
                 ["--ring-degree", "2", "--vae-tile-height", "512", "--vae-tile-width", "512", "--height", "2048",
                  "--width", "2048", "--dtype", "bfloat16"]):
        engine, info, request = generate_settings(build_parser().parse_args(["generate", *argv]))
        costs = costs_of(engine.model, info)
        world = machine("cpu", engine.config.world_size, engine.dtype)
        predicted = predict(layout_of(engine), costs, world, request)
        cost = estimate(engine, info, request, "cpu", 64 * GIB)
        assert (cost.memory_bytes, cost.seconds) == (predicted.node_bytes, predicted.total_s), argv


def test_memory_alone_is_refused_and_tiling_takes_the_decode_out():
    cost, request, info = _cost(["--height", "2048", "--width", "2048"], available=1 * GIB)
    assert cost.too_much_memory and cost.largest_fitting is not None
    tiled, _, _ = _cost(["--height", "2048", "--width", "2048", "--vae-tile-height", "512", "--vae-tile-width", "512"],
                        available=1 * GIB)
    assert tiled.decode_bytes * 16 == cost.decode_bytes    # a 512 px tile holds 1/16 of a 2048 px image
    assert not tiled.too_much_memory
    assert warning(_cost([], available=1 * GIB)[0], request, info.request_defaults()) is None


def test_on_a_gpu_the_check_is_one_devices_peak_by_the_devices_preset(monkeypatch):
    torch = pytest.importorskip("torch")
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=0: "NVIDIA H100 80GB HBM3")
    argv = ["--height", "8192", "--width", "8192", "--ulysses-degree", "2"]
    cost, request, info = _cost(argv, available=8 * GIB, device="cuda")
    engine, _, _ = generate_settings(build_parser().parse_args(["generate", *argv]))
    predicted = predict(layout_of(engine), costs_of(engine.model, info), world_from("h100-sxm", 2, 1), request)
    assert cost.where == "GPU memory" and cost.memory_bytes == predicted.memory.peak  # bfloat16: the preset's
    assert cost.too_much_memory and cost.largest_fitting[0] < 8192


def test_a_field_only_the_cost_model_reads_missing_skips_the_estimate_with_a_warning(tmp_path, launched, capsys):
    """diffusers fills a config's missing attention_head_dim from the class default: generate still runs, unjudged."""
    from meshdit.default_model import weights_path

    for path in weights_path().rglob("*.json"):
        target = tmp_path / "model" / path.relative_to(weights_path())
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(path.read_bytes())
    config = json.loads((weights_path() / "transformer" / "config.json").read_text())
    del config["attention_head_dim"]
    (tmp_path / "model" / "transformer" / "config.json").write_text(json.dumps(config))
    assert main(["generate", "--model", str(tmp_path / "model"), "--output", str(tmp_path / "x.png")]) == 0
    assert "no memory or time estimate for this request" in capsys.readouterr().err and len(launched) == 1
