"""A request that will take very long or needs more memory than the machine has is warned about before any
rank starts (meshdit/request_cost.py: estimated from config files and safetensors headers), naming the
estimate and what to change; the request still runs (a warning, not a refusal)."""
import json

import pytest

import meshdit.distributed.launch
from meshdit.cli import build_parser, generate_settings, main
from meshdit.default_model import weights_path
from meshdit.request_cost import GIB, estimate, transformer_parameters, warning


@pytest.fixture
def launched(monkeypatch):
    """The launches main() makes, recorded instead of run."""
    calls = []
    monkeypatch.setattr(meshdit.distributed.launch, "launch", lambda entry, job, world: calls.append(job))
    return calls


def _cost(argv, available=None):
    args = build_parser().parse_args(["generate", *argv])
    engine, info, request = generate_settings(args)
    return (estimate(engine.model, info, engine.config, request, engine.vae, engine.dtype, "cpu", available),
            request, info)


def test_8192_square_on_the_bundled_model_is_warned_about_and_still_runs(tmp_path, launched, capsys,
                                                                        monkeypatch):
    monkeypatch.setattr("meshdit.request_cost.available_memory", lambda device: 16 * GIB)
    status = main(["generate", "--height", "8192", "--width", "8192", "--output", str(tmp_path / "x.png")])
    err = capsys.readouterr().err
    assert status == 0 and len(launched) == 1, err
    warnings = [line for line in err.splitlines() if line.startswith("meshdit: warning: this request is heavy")]
    assert len(warnings) == 1, err
    text = warnings[0]
    for shown in ("8192x8192 is 262,144 image tokens (the model's default 256x256: 256)", "times the work",
                  "more than the 16.0 GiB available", "for the VAE decode", "a smaller --height/--width",
                  "fewer --steps", "--vae-tile-height"):
        assert shown in text, (shown, text)


def test_the_default_request_and_a_modest_one_get_no_warning(tmp_path, launched, capsys):
    for size in ([], ["--height", "512", "--width", "512"]):
        assert main(["generate", *size, "--output", str(tmp_path / "x.png")]) == 0
        assert "heavy" not in capsys.readouterr().err
    assert len(launched) == 2


def test_memory_alone_warns_and_tiling_takes_the_decode_out():
    cost, request, info = _cost(["--height", "2048", "--width", "2048"], available=1 * GIB)
    note = warning(cost, request, info.request_defaults())
    assert "more than the 1.0 GiB available" in note and "--vae-tile-height 1024" in note
    tiled, _, _ = _cost(["--height", "2048", "--width", "2048", "--vae-tile-height", "512", "--vae-tile-width", "512"],
                        available=1 * GIB)
    assert tiled.decode_bytes * 16 == cost.decode_bytes    # a 512 px tile holds 1/16 of a 2048 px image
    assert warning(_cost([], available=1 * GIB)[0], request, info.request_defaults()) is None


def test_parameters_come_from_the_safetensors_headers_or_else_the_config(tmp_path):
    model = str(weights_path())
    config = json.loads((weights_path() / "transformer" / "config.json").read_text())
    params, stored = transformer_parameters(model, config)
    header_bytes = (weights_path() / "transformer" / "diffusion_pytorch_model.safetensors").stat().st_size
    assert 0.9 * header_bytes < params * stored <= header_bytes   # the file is the tensors plus a header
    estimated, _ = transformer_parameters(str(tmp_path), config)  # no weights: 12 hidden^2 per block
    assert estimated == 12 * 128 * 128 * 9
