"""`meshdit plan` (and `--layout auto`) against hostile config JSON and flags: a one-line message naming the file or
flag, quickly, never a traceback, a hang or a MemoryError; an unknown model name lists the built-in ones; the table
names each column once and explains them; an uncalibrated machine is told to calibrate."""
from __future__ import annotations

import json
import time

import pytest

from meshdit.cli import main
from meshdit.default_model import weights_path
from meshdit.errors import ConfigError
from meshdit.planner.snapshots import snapshot_names

_BUNDLED_TRANSFORMER = json.loads((weights_path() / "transformer" / "config.json").read_text())
HOSTILE_TRANSFORMERS = {
    "layers-1e7": ({"num_layers": 10 ** 7}, "num_layers is 10000000; meshdit takes a whole number in 0..1000"),
    "layers-1e12": ({"num_layers": 10 ** 12}, "num_layers is 1000000000000;"),
    "layers-1e400": ({"num_layers": 10 ** 400}, "(401 characters); meshdit takes a whole number in 0..1000"),
    "heads-missing": ({"num_attention_heads": None}, "has no num_attention_heads"),
    "heads-text": ({"num_attention_heads": "4"}, "num_attention_heads is '4'"),
    "heads-negative": ({"num_attention_heads": -4}, "num_attention_heads is -4; meshdit takes a whole number in 1.."),
    "head-dim-missing": ({"attention_head_dim": None}, "has no attention_head_dim"),
    "mlp-ratio-inf": ({"mlp_ratio": float("inf")}, "mlp_ratio is inf"),
    "patch-list-of-text": ({"patch_size": ["1"]}, "patch_size is ['1']"),
    "nested-deep": (None, "nests its JSON deeper than Python's parser goes"),
}


def _hostile_model(tmp_path, name: str) -> str:
    """The bundled model's config files (no weights), its transformer config changed as HOSTILE_TRANSFORMERS says."""
    folder = tmp_path / name
    for path in weights_path().rglob("*.json"):
        target = folder / path.relative_to(weights_path())
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(path.read_bytes())
    change, _ = HOSTILE_TRANSFORMERS[name]
    if change is None:
        text = '{"a": ' * 100_000 + "1" + "}" * 100_000
    else:
        config = {k: v for k, v in {**_BUNDLED_TRANSFORMER, **change}.items() if v is not None}
        text = json.dumps(config)
    (folder / "transformer" / "config.json").write_text(text)
    return str(folder)


@pytest.mark.parametrize("name", HOSTILE_TRANSFORMERS)
def test_hostile_config_json_gets_a_message_from_plan_and_layout_auto(name, tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("MESHDIT_PLAN_DEVICE", "cpu")
    model = _hostile_model(tmp_path, name)
    message = HOSTILE_TRANSFORMERS[name][1]
    for argv in (["plan", "--model", model], ["plan", "--model", model, "--gpus", "8", "--preset", "h100-sxm"],
                 ["generate", "--model", model, "--layout", "auto", "--ranks", "2"]):
        start = time.perf_counter()
        assert main(argv) == 2, argv
        seconds = time.perf_counter() - start
        err = capsys.readouterr().err
        assert err.startswith("meshdit: error: ") and message in err and len(err.splitlines()) == 1, err
        assert "config.json" in err and seconds < 2, (argv, seconds)


PLAN_FLAGS = {
    "images-1e9": (["--images", "1000000000"], "--images must be in 1..4096, got 1000000000"),
    "intra-gbps-nan": (["--gpus", "2", "--intra-node-gbps", "nan"], "--intra-node-gbps must be a number of GB/s in"),
    "inter-gbps-inf": (["--gpus", "2", "--inter-node-gbps", "inf"], "--inter-node-gbps must be a number of GB/s in"),
    "intra-gbps-0": (["--gpus", "2", "--intra-node-gbps", "0"], "--intra-node-gbps must be a number of GB/s in"),
    "gpus-1e5": (["--gpus", "100000"], "--gpus must be a whole number >= 1 (at most 4096), got 100000"),
    "world-above-4096": (["--gpus", "8", "--nodes", "1024"], "is 8192 ranks; meshdit plans for at most 4096"),
    "gpu-memory-0": (["--gpus", "2", "--gpu-memory", "0GB"], "--gpu-memory 0GB is out of range"),
    "gpu-memory-overflow": (["--gpus", "2", "--gpu-memory", "9" * 400], "is out of range: give 1MB..1PB per GPU"),
    "steps-1e400": (["--steps", "1" + "0" * 400], "is out of range: it must be in 1..10000"),
    "warmup-1e400": (["--warmup-steps", "1" + "0" * 400], "is out of range: it must be in 1..10000"),
    "top-0": (["--top", "0"], "--top must be >= 1"),
}


@pytest.mark.parametrize("flags, message", PLAN_FLAGS.values(), ids=PLAN_FLAGS.keys())
def test_plan_numeric_flags_are_finite_positive_and_bounded(flags, message, capsys):
    start = time.perf_counter()
    assert main(["plan", *flags]) == 2
    err = capsys.readouterr().err
    assert err.startswith("meshdit: error: ") and message in err, err
    assert time.perf_counter() - start < 2


def test_an_unknown_model_name_lists_the_built_in_ones(capsys, monkeypatch):
    def not_on_the_hub(model, name):  # what config_files says when the Hub or its cache has no such model
        raise ConfigError(f"model {model!r} was not found: ... the Hugging Face Hub or its local cache")

    monkeypatch.setattr("meshdit.config_files._hub_file", not_on_the_hub)
    for name, guess in (("wan", "did you mean wan2.1-t2v-14b?"), ("fluxdev", "did you mean flux"),
                        ("no-such/model", "")):
        assert main(["plan", "--model", name]) == 2
        err = capsys.readouterr().err
        assert err.startswith(f"meshdit: error: --model {name!r} is not a built-in model: {guess}"), err
        assert all(snapshot in err for snapshot in snapshot_names()) and "Wan-AI/Wan2.1-T2V-14B-Diffusers" in err
        assert "the Hugging Face Hub or its local cache" in err  # and why the Hub id did not load


def test_the_table_names_each_column_once_and_explains_them(capsys):
    assert main(["plan", "--model", "flux1-dev", "--gpus", "4", "--gpu-memory", "32GB"]) == 0
    out = capsys.readouterr().out
    lines = out.splitlines()
    header = next(line for line in lines if line.startswith("layout "))
    names = header.split()
    assert len(names) == len(set(names)), names  # "vae" and "text" named two columns before
    assert "GB per rank" in lines[lines.index(header) - 1] and "seconds" in lines[lines.index(header) - 1]
    legend = " ".join(line.strip() for line in lines[lines.index(header):])
    for name in ("decode:", "fp8:", "encoders:", "weights (", "text (", "activ (", "kv (", "vae (", "peak =",
                 "step (", "total (", "approximate:"):
        assert name in legend, name


def test_an_uncalibrated_machine_is_told_to_calibrate(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("MESHDIT_PLAN_DEVICE", "cpu")
    monkeypatch.setenv("MESHDIT_CALIBRATION", str(tmp_path / "none.json"))
    import meshdit.distributed.launch

    monkeypatch.setattr(meshdit.distributed.launch, "launch", lambda *args: None)
    assert main(["plan"]) == 0
    assert "not calibrated" in capsys.readouterr().out
    assert main(["generate", "--layout", "auto", "--ranks", "2", "--output", str(tmp_path / "x.png")]) == 0
    chose = next(line for line in capsys.readouterr().out.splitlines() if "--layout auto chose" in line)
    assert "run `meshdit plan --calibrate`" in chose
    assert main(["plan", "--model", "flux1-dev", "--gpus", "2"]) == 0  # a GPU preset: nothing to calibrate
    assert "calibrate" not in capsys.readouterr().out
    (tmp_path / "calibration.json").write_text(json.dumps({"flops": 2e10}))
    monkeypatch.setenv("MESHDIT_CALIBRATION", str(tmp_path / "calibration.json"))
    assert main(["plan"]) == 0
    assert "calibrate" not in capsys.readouterr().out
