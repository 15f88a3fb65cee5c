"""`meshdit serve` refuses bad flags before any rank starts (in-process: nothing is spawned)."""
import socket
from pathlib import Path

import pytest

from meshdit.cli import build_parser, generate_settings, main
from meshdit.serve.command import GENERATE_ONLY, is_loopback, serve_settings


def test_serve_shares_generate_model_and_layout_flags():
    args = build_parser().parse_args(["serve", "--ulysses_degree", "2", "--steps", "4", "--no-batching",
                                      "--no-kv-drift-correction"])
    assert (args.ulysses_degree, args.steps, args.no_batching, args.port) == (2, 4, True, 8000)
    assert args.no_kv_drift_correction


def test_refusals_name_the_flag(capsys):
    assert main(["serve", "--max-queue", "0"]) == 2
    assert "--max-queue" in capsys.readouterr().err
    assert main(["serve", "--ulysses-degree", "2", "--height", "60"]) == 2
    assert "height 60" in capsys.readouterr().err
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        assert main(["serve", "--port", str(taken.getsockname()[1])]) == 2
        assert "choose another --port" in capsys.readouterr().err


# Each refusal comes from the one pre-launch check (meshdit/prelaunch.py): layout, VAE settings, the model's VAE
# config (serve skipped it before), FP8, request ranges and the model's rules.
@pytest.mark.parametrize("flags, message", [
    (["--ulysses-degree", "8"], "exceeds the model's 4 attention heads"),
    (["--ulysses-degree", "2", "--height", "60"], "height 60 cannot be split"),
    (["--vae-tile-height", "100", "--vae-tile-width", "96"], "--vae-tile-height (100 px)"),
    (["--vae-tile-height", "128", "--vae-tile-width", "128", "--vae-tile-frames", "2"], "has no temporal tiling"),
    (["--fp8-comm-k"], "needs --fp8-comm too"),
    (["--fp8-stale-kv"], "this run has no PipeFusion"),
    (["--steps", "0"], "--steps 0 is out of range"),
    (["--max-sequence-length", "0"], "--max-sequence-length 0"),
])
def test_generate_and_serve_refuse_alike(flags, message, capsys, tmp_path):
    assert main(["generate", *flags, "--output", str(tmp_path / "x.png")]) == 2
    generate_error = capsys.readouterr().err
    assert main(["serve", *flags]) == 2
    assert capsys.readouterr().err == generate_error
    assert message in generate_error


def test_every_generate_flag_is_a_serve_flag_unless_per_request():
    subcommands = build_parser()._subparsers._group_actions[0].choices
    generate = {a.dest: a for a in subcommands["generate"]._actions if a.option_strings}
    serve = {a.dest: a for a in subcommands["serve"]._actions if a.option_strings}
    assert set(GENERATE_ONLY) <= set(generate), "GENERATE_ONLY names a flag generate does not have"
    missing = set(generate) - set(serve) - set(GENERATE_ONLY)
    assert not missing, f"generate flags missing on serve: {sorted(missing)}"
    assert not set(GENERATE_ONLY) & set(serve)
    for dest in set(generate) - set(GENERATE_ONLY) - {"help"}:  # the same spellings, choices and defaults
        g, s = generate[dest], serve[dest]
        assert (g.option_strings, g.choices, g.default, g.help) == (s.option_strings, s.choices, s.default, s.help)


def test_per_request_flags_name_fields_of_the_request_body():
    """A generate flag serve leaves to each request (`--image` among them) names the body field that carries it."""
    from meshdit.serve.schemas import ImageRequest

    fields = {why.split("`")[1] for why in GENERATE_ONLY.values() if why.startswith("per request: the request's `")}
    assert {"prompt", "image", "seed", "n", "loras"} <= fields
    assert fields <= set(ImageRequest.model_fields)


def test_a_model_that_needs_an_image_is_not_refused_for_the_defaults_having_none(tmp_path, capsys):
    """serve's request defaults carry no image (each request brings its own input_reference): an image-to-video
    model is served, where generate asks for --image."""
    import json

    for part, config in (("", {"_class_name": "WanImageToVideoPipeline"}),
                         ("transformer", {"_class_name": "WanTransformer3DModel", "num_attention_heads": 4,
                                          "num_layers": 2, "patch_size": [1, 2, 2], "added_kv_proj_dim": 48}),
                         ("vae", {"_class_name": "AutoencoderKLWan", "scale_factor_spatial": 8,
                                  "scale_factor_temporal": 4})):
        (tmp_path / part).mkdir(exist_ok=True)
        (tmp_path / part / ("config.json" if part else "model_index.json")).write_text(json.dumps(config))
    assert main(["generate", "--model", str(tmp_path), "--output", str(tmp_path / "x.mp4")]) == 2
    assert "animates an image: pass its first frame with --image PATH" in capsys.readouterr().err
    settings = serve_settings(build_parser().parse_args(["serve", "--model", str(tmp_path)]))
    assert settings.request.image is None and settings.request.num_frames == 81  # Wan's default


FIXED_SIZE = {"cogvideox-i2v": (48, 80)}  # CogVideoX-5B I2V's learned positional embeddings: their size only


def test_every_video_family_is_served(tiny_folder):
    """Each video family's tiny pipelines (text to video, and image to video where it has one) pass serve's checks
    with a frame count and fps of the family's; an image model refuses --num-frames as generate does."""
    from meshdit.testing.tiny_models import tiny_families

    for family, module in tiny_families(video=True):
        for name in (module.TESTS.main, *(build for build, _ in module.TESTS.image_to_video)):
            height, width, model = *FIXED_SIZE.get(name, (64, 64)), tiny_folder(name)
            settings = serve_settings(build_parser().parse_args([
                "serve", "--model", model, "--height", str(height), "--width", str(width), "--num-frames", "9"]))
            assert (settings.request.num_frames, settings.request.fps) == (9, family.video.fps), name
    with pytest.raises(Exception, match="--num-frames is for video models"):
        serve_settings(build_parser().parse_args(["serve", "--num-frames", "9"]))
    with pytest.raises(Exception, match="each video request makes one video"):
        serve_settings(build_parser().parse_args(["serve", "--model", tiny_folder("wan"), "--height", "64",
                                                  "--width", "64", "--num-frames", "9", "--data-parallel-degree", "2"]))


def test_every_serve_flag_has_a_help_text_with_its_default():
    serve = build_parser()._subparsers._group_actions[0].choices["serve"]
    for action in serve._actions:
        if action.dest != "help":
            assert action.help and "default" in action.help, action.option_strings


ENGINE_AND_DEFAULT_FLAGS = [
    "--dtype", "bfloat16", "--fp8-gemm", "--attention-backend", "fp8", "--fp8-comm", "--fp8-comm-k",
    "--fp8-stale-kv", "--memory-efficient-load", "--text-encoder-device", "cpu", "--pipefusion-parallel-degree", "2",
    "--compile", "aot_eager", "--use-parallel-vae", "--verbose", "--height", "64", "--width", "48", "--steps", "3",
    "--guidance-scale", "2.5", "--max-sequence-length", "16", "--warmup-steps", "2", "--num-pipeline-patch", "4",
    "--no-kv-drift-correction"]


def test_every_engine_and_default_setting_reaches_serves_ranks_as_generates(monkeypatch):
    """What serve hands its ranks (ServeSettings.engine -> rank.start_rank) equals what generate hands its ranks
    (GenerateJob.engine), and serve's request defaults equal generate's resolved request, but for the prompt."""
    import dataclasses

    from meshdit import cli
    from meshdit.quant import formats

    monkeypatch.setattr(formats, "fp8_gemm_problem", lambda device: None)  # this CPU's answer is not the point
    generate_args = build_parser().parse_args(["generate", *ENGINE_AND_DEFAULT_FLAGS])
    engine, _, request = cli.generate_settings(generate_args)
    settings = serve_settings(build_parser().parse_args(["serve", *ENGINE_AND_DEFAULT_FLAGS]))
    assert settings.engine == engine
    assert (engine.dtype, engine.fp8.gemm, engine.fp8.stale_kv, engine.loading.memory_efficient,
            engine.loading.text_encoder_device, engine.config.compile, engine.vae.parallel) == (
        "bfloat16", True, True, True, "cpu", "aot_eager", True)
    assert settings.request == dataclasses.replace(request, prompt=("-",))
    assert (request.height, request.width, request.num_inference_steps, request.warmup_steps,
            request.extra["max_sequence_length"]) == (64, 48, 3, 2, 16)


def test_serve_generate_and_the_api_share_the_bundled_models_defaults_and_the_page_prefills_them(monkeypatch):
    from fastapi.testclient import TestClient

    from meshdit.config import GenerateRequest
    from meshdit.default_model import weights_path
    from meshdit.models.info import ModelInfo
    from meshdit.request import resolve_request
    from meshdit.serve.app import create_app
    from meshdit.serve.server_state import ServerState

    monkeypatch.delenv("MESHDIT_API_KEY", raising=False)
    settings = serve_settings(build_parser().parse_args(["serve"]))
    generate = generate_settings(build_parser().parse_args(["generate", "--prompt", "-"]))[2]
    api = resolve_request(GenerateRequest(prompt=["-"]), ModelInfo.from_pretrained(str(weights_path())))
    assert settings.request == generate == api  # Engine.resolve is this resolve_request call
    assert (api.height, api.width, api.num_inference_steps) == (256, 256, 20)  # not the family's 1024 x 1024
    health = TestClient(create_app(ServerState(settings))).get("/health").json()  # 503 while loading: still says
    assert health["defaults"] == {"size": "256x256", "steps": 20}
    page = (Path(__file__).resolve().parents[2] / "meshdit" / "serve" / "page.html").read_text()
    assert '$("size").value = h.defaults.size' in page  # the web page prefills /health's defaults


@pytest.mark.parametrize("host", ["0.0.0.0", "::", "192.0.2.7"])
def test_a_non_loopback_host_without_an_api_key_is_refused_unless_allowed_then_warned(host, monkeypatch, capsys):
    from meshdit.serve import command, launch

    monkeypatch.delenv("MESHDIT_API_KEY", raising=False)
    started = []
    monkeypatch.setattr(launch, "serve_ranks", lambda settings: started.append(settings) or 0)
    monkeypatch.setattr(command, "_check_port", lambda host, port: None)  # 192.0.2.7 is no address of ours
    assert main(["serve", "--host", host]) == 2
    err = capsys.readouterr().err
    assert f"--host {host} is reachable from other machines" in err and "--allow-unauthenticated" in err
    assert not started
    assert main(["serve", "--host", host, "--allow-unauthenticated"]) == 0
    assert "WARNING" in capsys.readouterr().err and len(started) == 1
    assert main(["serve", "--host", host, "--api-key", "k"]) == 0
    assert "WARNING" not in capsys.readouterr().err and len(started) == 2


@pytest.mark.parametrize("host", ["127.0.0.1", "localhost", "::1", "127.0.0.2"])
def test_loopback_hosts_need_no_api_key(host):
    assert is_loopback(host)


def test_a_stray_folder_in_lora_dir_is_skipped_with_a_warning(tiny_folder, tmp_path, capsys):
    """A folder named like an adapter file (x.safetensors) is no adapter: skipped, saying so, not refused as --lora."""
    from meshdit.testing.tiny_lora import save_tiny_lora

    (tmp_path / "loras" / "x.safetensors").mkdir(parents=True)
    ink = save_tiny_lora("flux", str(tmp_path / "loras" / "ink.safetensors"), seed=1)
    args = build_parser().parse_args(["serve", "--model", tiny_folder("flux"), "--lora-dir",
                                      str(tmp_path / "loras"), "--height", "32", "--width", "48"])
    assert serve_settings(args).engine.loras == (("ink", ink),)
    assert "--lora-dir" in (err := capsys.readouterr().err) and "skipping 'x.safetensors'" in err, err
