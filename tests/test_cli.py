"""`meshdit generate` end to end: output files, aliases, torchrun, early errors, failing ranks, Ctrl-C."""
import dataclasses
import json
import os
import re
import signal
import subprocess
import sys
import time

import numpy as np
import pytest
from PIL import Image

from meshdit.cli import build_parser, generate_settings, main
from meshdit.config import GenerateRequest, ParallelConfig
from meshdit.errors import ConfigError
from meshdit.models.registry import FAMILIES
from meshdit.engine import Engine
from meshdit.testing.tiny_models import sample_image, tiny_families, tiny_pipeline

CLI = [sys.executable, "-m", "meshdit", "generate"]


def run_cli(args, timeout=120, env=None):
    start = time.monotonic()
    proc = subprocess.run(CLI + args, capture_output=True, text=True, timeout=timeout,
                          env={**os.environ, **(env or {})})
    return proc, time.monotonic() - start


def test_generate_png_with_xdit_aliases(tiny_flux_dir, tmp_path):
    out = tmp_path / "img.png"
    proc, _ = run_cli(["--model", tiny_flux_dir, "--prompt", "a red cat", "--height", "36", "--width", "44",
                       "--num_inference_steps", "2", "--ulysses_degree", "2", "--pipefusion_parallel_degree", "2",
                       "--num_pipeline_patch", "3", "--warmup_steps", "1", "--output", str(out)])
    assert proc.returncode == 0, proc.stderr
    assert Image.open(out).size == (44, 36)
    assert "layout pp2 x ulysses2 on 4 rank(s)" in proc.stdout
    assert "1 image(s) height 36 x width 44, 2 steps" in proc.stdout  # as the flags say, not W x H


def test_npy_outputs_same_under_torchrun_data_and_ring_parallel_as_serial(tiny_flux_dir, tmp_path):
    common = ["--model", tiny_flux_dir, "--prompt", "a red cat", "--prompt", "a blue dog", "--height", "32",
              "--width", "32", "--steps", "2", "--guidance-scale", "2.5"]
    serial, par = str(tmp_path / "serial-{i}.npy"), str(tmp_path / "par-{i}.npy")
    proc, _ = run_cli(common + ["--output", serial])
    assert proc.returncode == 0, proc.stderr
    torchrun = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "4", "-m", "meshdit", "generate"]
    # torchrun makes itself a torchelastic_* log folder under TMPDIR and leaves it: keep it in tmp_path
    proc = subprocess.run(torchrun + common + ["--data-parallel-degree", "2", "--ring-degree", "2", "--output", par],
                          capture_output=True, text=True, timeout=240, env={**os.environ, "TMPDIR": str(tmp_path)})
    assert proc.returncode == 0, proc.stderr
    for i in range(2):
        a, b = np.load(serial.format(i=i)), np.load(par.format(i=i))
        assert a.shape == (32, 32, 3) and a.dtype == np.float32 and 0 <= a.min() and a.max() <= 1
        assert np.abs(a - b).max() <= 1e-5 * np.abs(a).max()
    assert np.abs(np.load(serial.format(i=0)) - np.load(serial.format(i=1))).max() > 1e-3  # two prompts, two images


EDIT_FAMILIES = [module.TESTS for _, module in tiny_families(video=False) if module.TESTS.edit]


@pytest.mark.parametrize("tests", EDIT_FAMILIES, ids=lambda t: t.edit)
def test_generate_image_on_two_ranks_equals_one_process(tests, tiny_folder, tmp_path):
    """`--image` on an edit model under Ulysses 2 (only rank 0 decodes, every rank encodes the image) equals the
    in-process engine on the same request; the image changes the picture (where the model also runs without one).
    Every family with a tiny edit pipeline: FLUX.1 Kontext, Qwen-Image-Edit (its folder saved and loaded without
    torchvision, models/qwen_vl_processor.py)."""
    pipe, model = tiny_pipeline(tests.edit), tiny_folder(tests.edit)
    sample_image(40, 56).save(tmp_path / "input.png")
    extra = [f"--extra={key}={json.dumps(value)}" for key, value in tests.request_extra.items()]
    guidance = [] if tests.guidance is None else ["--guidance-scale", str(tests.guidance)]
    common = ["--height", "32", "--width", "48", "--steps", "2", "--max-sequence-length", "8", *guidance, *extra,
              "--seed", "3", "--prompt", "make the cat blue"]
    proc, _ = run_cli(["--model", model, *common, "--image", str(tmp_path / "input.png"),
                       "--ulysses-degree", "2", "--output", str(tmp_path / "out.npy")], timeout=300)
    assert proc.returncode == 0, proc.stderr
    request = _cli_request(["--model", model, *common, "--image", str(tmp_path / "input.png")])
    engine = Engine(pipe)
    try:
        alone = engine.generate(request).images[0]
        text_only = engine.generate(dataclasses.replace(request, image=None)).images[0] \
            if not engine.info.needs_image else None
    finally:
        engine.close()
    out = np.load(tmp_path / "out.npy")
    assert np.abs(out - alone).max() <= 1e-5 * np.abs(alone).max()
    if text_only is not None:
        assert np.abs(text_only - alone).max() > 1e-3


def test_degrees_that_do_not_match_world_size_are_refused():
    with pytest.raises(ConfigError, match="multiply to 4 .* world has 3 ranks"):
        ParallelConfig(ulysses_degree=2, ring_degree=2).validate(world_size=3)


def test_torchrun_world_of_three_for_ulysses2_ring2_fails_before_ranks_start(tiny_flux_dir, tmp_path):
    env = {"TORCHELASTIC_RUN_ID": "x", "RANK": "0", "WORLD_SIZE": "3", "LOCAL_RANK": "0"}
    proc, _ = run_cli(["--model", tiny_flux_dir, "--ulysses-degree", "2", "--ring-degree", "2", "--height", "32",
                       "--width", "32", "--output", str(tmp_path / "x.png")], env=env)
    assert proc.returncode == 2
    assert "torchrun started 3 ranks but the degrees multiply to 4" in proc.stderr


@pytest.mark.parametrize("args,message", [
    (["--ulysses-degree", "8"], "exceeds the model's 4 attention heads: use --ulysses-degree <= 4"),
    (["--height", "34"], "height 34 cannot be split into this model's patches: it must be a multiple of 4"),
    (["--pipefusion-parallel-degree", "3"], "needs a block per stage, but the model has 2 blocks"),
    (["--prompt", "a", "--prompt", "b"], "has no {i}"),
], ids=["ulysses-above-heads", "height", "stages-above-blocks", "output-pattern"])
def test_bad_configuration_fails_before_ranks_start(tiny_flux_dir, tmp_path, args, message):
    base = ["--model", tiny_flux_dir, "--height", "32", "--width", "32", "--output", str(tmp_path / "x.png")]
    proc, _ = run_cli(base + args)
    assert proc.returncode == 2, proc.stderr
    assert message in proc.stderr
    assert "rank" not in proc.stderr.replace("ranks:", "")  # no rank was started
    assert not (tmp_path / "x.png").exists()


def test_missing_model_is_a_clear_error(tmp_path):
    proc, _ = run_cli(["--model", str(tmp_path / "nope"), "--output", str(tmp_path / "x.png")],
                      env={"HF_HUB_OFFLINE": "1"})
    assert proc.returncode == 2 and "was not found" in proc.stderr


def test_rank_failing_mid_generation_ends_every_rank_promptly(tiny_flux_dir, tmp_path):
    proc, seconds = run_cli(["--model", tiny_flux_dir, "--height", "32", "--width", "32", "--steps", "50",
                             "--ring-degree", "2", "--output", str(tmp_path / "x.png")],
                            env={"MESHDIT_FAIL_AT_STEP": "1:1"})
    assert proc.returncode == 1
    assert "rank 1 failed: " in proc.stderr and "failure injected at step 1" in proc.stderr
    assert seconds < 60
    assert not (tmp_path / "x.png").exists()


def test_ctrl_c_stops_every_rank(tiny_flux_dir, tmp_path):
    proc = subprocess.Popen(CLI + ["--model", tiny_flux_dir, "--height", "64", "--width", "64", "--steps", "10000",
                                   "--ring-degree", "2", "--output", str(tmp_path / "x.png")],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True,
                            # as from a terminal: a suite started as a background job (`cmd &` in a script)
                            # passes SIGINT down ignored, and then no program sees Ctrl-C
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    deadline = time.monotonic() + 120
    seen = ""
    while "denoising" not in seen and time.monotonic() < deadline:
        seen += os.read(proc.stderr.fileno(), 4096).decode(errors="replace")
    assert "denoising" in seen
    os.killpg(proc.pid, signal.SIGINT)  # what the terminal sends to the whole foreground group
    try:
        proc.wait(timeout=20)
    except subprocess.TimeoutExpired:  # say which processes were left, and in what state
        left = subprocess.run(["ps", "-ww", "-o", "pid,stat,wchan:24,etime,args", "-s", str(proc.pid)], capture_output=True,
                              text=True).stdout
        os.killpg(proc.pid, signal.SIGKILL)
        pytest.fail(f"no exit within 20 s of Ctrl-C; processes then:\n{left}\nstderr after 'denoising':\n"
                    f"{proc.stderr.read()[-4000:]}")
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode == 130
    deadline = time.monotonic() + 10  # rank processes must be gone, not just the parent
    while time.monotonic() < deadline:
        leftover = subprocess.run(["pgrep", "-a", "-s", str(proc.pid)], capture_output=True, text=True).stdout
        if not leftover:
            break
        time.sleep(0.5)
    assert leftover == ""


def _generate_parser():
    return build_parser()._subparsers._group_actions[0].choices["generate"]


def test_help_gives_every_flag_a_help_text_with_its_default(capsys):
    parser = _generate_parser()
    for action in parser._actions:
        if action.dest != "help":
            assert action.help and "default" in action.help, action.option_strings
    text = " ".join(parser.format_help().split())  # unwrapped
    for shown in ("--num_inference_steps", "bundled model: 256", "bundled model: 20", "(default: 0)",
                  "(default: 1;", "docs/pipefusion.md", "(default: meshdit.png)"):
        assert shown in text, shown
    with pytest.raises(SystemExit) as exit_:
        main(["--version"])
    assert exit_.value.code == 0 and capsys.readouterr().out.startswith("meshdit 0.1.0")


# Every spelling users have today (xDiT's included): none may disappear.
GENERATE_FLAGS = """--attention-backend --attention_backend --cfg-degree --cfg_degree --lora-2 --lora_2 --data-parallel-degree --data_parallel_degree --dtype --fp8-comm
--fp8-comm-k --fp8-gemm --fp8_comm --fp8_comm_k --fp8_gemm --guidance-scale --guidance_scale --height
--max-sequence-length --max_sequence_length --memory-efficient-load --memory_efficient_load
--memory_efficient_replicated_load --model --negative-prompt --negative_prompt --no-kv-drift-correction
--no_kv_drift_correction --no-memory-efficient-load --no-memory_efficient_load --no-memory_efficient_replicated_load --num-images-per-prompt --num-inference-steps
--num-pipeline-patch --num_images_per_prompt --num_inference_steps --num_pipeline_patch --output
--pipefusion-parallel-degree --pipefusion_parallel_degree --prompt --prompt-file --prompt_file --ring-degree
--ring_degree --seed --steps --text-encoder-device --text_encoder_device --ulysses-degree --ulysses_degree
--use-cfg-parallel --use-fp8-gemms --use-parallel-vae --use_cfg_parallel --use_fp8_gemms --use_parallel_vae
--vae-tile-frames --vae-tile-height --vae-tile-overlap --vae-tile-width --vae_tile_frames --vae_tile_height
--vae_tile_overlap --vae_tile_width --verbose --warmup-steps --warmup_steps --width""".split()
SERVE_FLAGS = """--api-key --cfg-degree --cfg_degree --data-parallel-degree --data_parallel_degree --dtype --guidance-scale --guidance_scale --height
--host --max-batch-images --max-images --max-queue --max-sequence-length --max_sequence_length --model --no-batching
--no-kv-drift-correction --no_kv_drift_correction
--num-inference-steps --num-pipeline-patch --num_inference_steps --num_pipeline_patch --pipefusion-parallel-degree
--pipefusion_parallel_degree --port --queue-timeout --request-timeout --ring-degree --ring_degree --steps
--ulysses-degree --ulysses_degree --use-cfg-parallel --use-parallel-vae --use_cfg_parallel --use_parallel_vae
--vae-tile-frames --vae-tile-height --vae-tile-overlap --vae-tile-width --vae_tile_frames --vae_tile_height
--vae_tile_overlap --vae_tile_width --verbose --warmup-steps --warmup_steps --width""".split()


def test_no_flag_users_have_disappears():
    subcommands = build_parser()._subparsers._group_actions[0].choices
    for name, expected in (("generate", GENERATE_FLAGS), ("serve", SERVE_FLAGS)):
        spellings = {s for action in subcommands[name]._actions for s in action.option_strings}
        assert set(expected) <= spellings, (name, sorted(set(expected) - spellings))


def test_flags_are_built_from_the_settings_fields():
    """Each flagged field gives one flag (kebab and underscore spellings) whose help is the field's, and
    parsing no flags gives each settings class its own defaults."""
    from meshdit.flag_spec import flag_specs
    from meshdit.flags import settings_from_args
    from meshdit.loading.options import LoadOptions
    from meshdit.quant.settings import Fp8Config
    from meshdit.vae.settings import VaeDecodeSettings

    parser = _generate_parser()
    by_spelling = {s: action for action in parser._actions for s in action.option_strings}
    classes = (ParallelConfig, GenerateRequest, VaeDecodeSettings, Fp8Config, LoadOptions)
    for cls in classes:
        assert flag_specs(cls), cls
        for field, spec in flag_specs(cls):
            action = by_spelling[f"--{spec.name}"]
            assert by_spelling[f"--{spec.name.replace('-', '_')}"] is action
            assert action.help == spec.help and action.dest == spec.dest, field.name
    args = parser.parse_args([])
    for cls in (ParallelConfig, VaeDecodeSettings, Fp8Config, LoadOptions):
        assert settings_from_args(cls, args) == cls()
    args = parser.parse_args(["--use-cfg-parallel", "--vae_tile_width", "512", "--steps", "3"])
    assert settings_from_args(ParallelConfig, args).cfg_degree == 2
    assert settings_from_args(ParallelConfig, parser.parse_args(["--cfg-degree", "3"])).cfg_degree == 3
    assert settings_from_args(VaeDecodeSettings, args).tile_width == 512
    assert settings_from_args(GenerateRequest, args, prompt=["a"]).num_inference_steps == 3
    assert settings_from_args(GenerateRequest, args, prompt=["a"]).kv_drift_correction  # on unless turned off
    args = parser.parse_args(["--no_kv_drift_correction"])
    assert not settings_from_args(GenerateRequest, args, prompt=["a"]).kv_drift_correction


def test_several_prompts_per_flag_and_abbreviations_of_a_flag_and_its_alias():
    args = build_parser().parse_args(["generate", "--prompt", "a", "b", "--prompt", "c", "--ulysses", "2",
                                      "--num_inference", "3", "--pipefusion", "2"])
    assert args.prompt == ["a", "b", "c"]
    assert (args.ulysses_degree, args.steps, args.pipefusion_parallel_degree) == (2, 3, 2)


def _cli_request(argv):
    return generate_settings(build_parser().parse_args(["generate"] + argv))[2]


def test_api_takes_the_same_defaults_as_the_cli(tiny_flux_dir, capfd):
    from meshdit import Engine

    prompt = ["two green squares on a white background"]
    bundled = Engine.from_pretrained()  # no model: the bundled one, quietly
    assert "Loading" not in capfd.readouterr().err  # diffusers' and transformers' loading bars stay off
    request = bundled.resolve(GenerateRequest(prompt=prompt, seed=0))
    assert request == _cli_request(["--prompt", prompt[0]])
    assert (request.height, request.width, request.num_inference_steps, request.guidance_scale,
            request.extra["max_sequence_length"]) == (256, 256, 20, 3.0, 32)
    image = bundled.generate(GenerateRequest(prompt=prompt, num_inference_steps=1)).images
    assert image.shape == (1, 256, 256, 3)  # not diffusers' 1024 x 1024
    tiny = Engine(tiny_pipeline("flux")).resolve(GenerateRequest(prompt=prompt))
    assert tiny == _cli_request(["--model", tiny_flux_dir, "--prompt", prompt[0]])
    # tiny FLUX.1 has no guidance embedding: its guidance is true_cfg_scale, 1 by default (one branch, as diffusers)
    assert (tiny.num_inference_steps, tiny.guidance_scale, tiny.extra["max_sequence_length"]) == (28, 1.0, 512)


@pytest.mark.parametrize("family", FAMILIES, ids=lambda f: f.name)
def test_registry_defaults_equal_diffusers(family):
    """The rows' plain-data defaults are diffusers' own (recipes take theirs from the rows)."""
    import inspect

    import diffusers

    for pipeline_class in family.pipeline_classes:
        call = inspect.signature(getattr(diffusers, pipeline_class).__call__).parameters
        if "max_sequence_length" in call:  # HunyuanDiT's text lengths are fixed by its transformer
            assert family.max_sequence_length_for(pipeline_class) == call["max_sequence_length"].default
        assert family.defaults.steps == call["num_inference_steps"].default, pipeline_class
        if family.defaults.guidance_from_guider:  # HunyuanVideo 1.5: the declared guider class's default
            guider = inspect.signature(getattr(diffusers, pipeline_class).__init__).parameters["guider"]
            scale = inspect.signature(guider.annotation.__init__).parameters["guidance_scale"].default
            assert "guidance_scale" not in call and family.defaults.guidance == scale, pipeline_class
        else:
            assert family.default_guidance_for(pipeline_class) == call[family.guidance.argument].default, pipeline_class
        if family.guidance.undistilled_argument:  # FLUX.1 without a guidance embedding: true_cfg_scale
            assert family.default_guidance_for(pipeline_class, {}) == \
                call[family.guidance.undistilled_argument].default, pipeline_class
        if family.guidance.true_cfg_needs_negative_prompt:  # do_true_cfg needs one: its default is None
            assert call["negative_prompt"].default is None, pipeline_class
        # (no height / width: HunyuanVideo 1.5 I2V takes the bucket of its image, meshdit the config's bucket below)
        size = (call["height"].default, call["width"].default) if "height" in call else None
        frames = call.get("num_frames")
        if family.defaults.pixel_size_by_config:  # HunyuanVideo 1.5: the bucket of the config's target_size
            key, sizes = family.defaults.pixel_size_by_config
            pipe_module = inspect.getmodule(getattr(diffusers, pipeline_class))
            init = inspect.signature(getattr(diffusers, family.transformer_class).__init__).parameters
            processor = pipe_module.HunyuanVideo15ImageProcessor(vae_scale_factor=16)
            for value, pixels in sizes.items():
                assert processor.calculate_default_height_width(9, 16, value) == pixels, (pipeline_class, value)
            size = sizes[init[key].default]
        frames = frames and frames.default
        if family.is_video and size == (None, None):  # CogVideoX: the config's sample_height / _width x its
            # VAE's 8, and its sample_frames
            init = inspect.signature(getattr(diffusers, family.transformer_class).__init__).parameters
            size = (init["sample_height"].default * 8, init["sample_width"].default * 8)
            frames = init["sample_frames"].default
        if "max_area" in call:  # FLUX.1 Kontext scales any size to max_area at its aspect ratio: square by default
            size = (round(call["max_area"].default ** 0.5),) * 2
        body = inspect.getsource(getattr(diffusers, pipeline_class).__call__)
        fixed = [re.search(rf"\b{side} = {side} or (\d+)\b", body) for side in ("height", "width")]
        if size == (None, None) and all(fixed):  # Z-Image: `height = height or 1024` in __call__'s body
            size = tuple(int(m.group(1)) for m in fixed)
        if family.defaults.pixel_size:
            assert family.defaults.pixel_size == size, pipeline_class
        if family.is_video:  # (fps is no pipeline argument but LTX's frame_rate: else the docs' export fps)
            assert family.video.num_frames == frames, pipeline_class
            if "frame_rate" in call:
                assert family.video.fps == call["frame_rate"].default, pipeline_class


def test_a_fixed_text_length_refuses_another_max_sequence_length():
    """HunyuanDiT's transformer takes exactly 77 BERT + 256 T5 tokens: another length is refused before ranks start."""
    from meshdit.models.info import ModelInfo

    info = ModelInfo.from_pipeline(tiny_pipeline("hunyuandit"))
    with pytest.raises(ConfigError, match="takes exactly 256 text tokens.*not 100: drop --max-sequence-length"):
        info.check_request(ParallelConfig(), GenerateRequest(prompt="a cat", height=64, width=64,
                                                             extra={"max_sequence_length": 100}))
    info.check_request(ParallelConfig(), GenerateRequest(prompt="a cat", height=64, width=64))  # its default passes


def test_a_fixed_text_length_is_read_from_the_transformer_config():
    """CogVideoX without rotary embeddings takes exactly its positional table's max_text_seq_length text tokens
    (16 in diffusers' test config, not the released 226): that is its default, and another length is refused."""
    from meshdit.models.info import ModelInfo

    info = ModelInfo.from_pipeline(tiny_pipeline("cogvideox-sincos16"))
    assert info.request_defaults().max_sequence_length == 16
    request = dict(prompt="a cat", height=48, width=80, num_frames=9)
    info.check_request(ParallelConfig(), GenerateRequest(**request))
    with pytest.raises(ConfigError, match="takes exactly 16 text tokens.*not 226: drop --max-sequence-length"):
        info.check_request(ParallelConfig(), GenerateRequest(**request, extra={"max_sequence_length": 226}))
    rotary = ModelInfo.from_pipeline(tiny_pipeline("cogvideox"))  # rotary embeddings: any length, default 226
    assert rotary.request_defaults().max_sequence_length == 226
    rotary.check_request(ParallelConfig(), GenerateRequest(**request, extra={"max_sequence_length": 16}))


def test_unreachable_hub_fails_within_seconds(tmp_path):
    env = {k: v for k, v in os.environ.items() if "PROXY" not in k.upper() and k != "HF_HUB_OFFLINE"}
    env.update(HF_HOME=str(tmp_path / "hf"), HF_ENDPOINT="http://huggingface.invalid")
    start = time.monotonic()
    proc = subprocess.run(CLI + ["--model", "someone/not-cached", "--output", str(tmp_path / "x.png")],
                          capture_output=True, text=True, timeout=120, env=env)
    assert proc.returncode == 2, proc.stderr
    assert "huggingface.invalid cannot be reached" in proc.stderr and "HF_HUB_OFFLINE=1" in proc.stderr
    assert time.monotonic() - start < 10  # was 23 s of retries
