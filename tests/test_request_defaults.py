"""A request with no options is the plain pipeline call with no options (issue 60, item 1): each family's
`meshdit generate --model DIR --prompt P` resolves, before any rank starts, the request a rank then runs
(Engine.generate), and that image equals diffusers' `pipe(P)`. Both get one option more, --steps 1
(num_inference_steps=1), to keep the suite cheap; sizes, guidance, true CFG, negative prompt, text length and
frames are each side's own defaults."""
import numpy as np
import pytest
import torch

from meshdit.cli import build_parser, generate_settings
from meshdit.engine import Engine
from meshdit.testing.tiny_models import tiny_pipeline

PROMPT = "a red circle"
# tiny pipelines whose default size is cheap to run. Not here, checked against __call__'s signature by
# tests/test_cli.py::test_registry_defaults_equal_diffusers: the video families with fixed defaults (480 x 832 x 81
# frames and up; tiny Wan's rotary table does not even cover them), FLUX.1 Kontext (1024 x 1024 from max_area: 65536
# tiny tokens), FLUX.2 (its tiny build has no text encoder), PixArt (its tiny sample_size has no resolution bin:
# the plain call raises "Invalid sample size").
NAMES = ["flux", "flux-distilled", "chroma", "sd3", "hunyuandit", "sana", "qwenimage", "cogvideox"]


def _meshdit_request(model: str, *flags: str):
    args = build_parser().parse_args(["generate", "--model", model, "--prompt", PROMPT, "--steps", "1", *flags])
    return generate_settings(args)[2]


def _diffusers(pipe, **kwargs):
    pipe.set_progress_bar_config(disable=True)
    with torch.inference_mode():
        out = pipe(prompt=PROMPT, num_inference_steps=1, generator=torch.Generator("cpu").manual_seed(0), output_type="np",
                   **kwargs)
    return out.frames if hasattr(out, "frames") else out.images


def _meshdit(pipe, request):
    engine = Engine(pipe)
    try:
        return engine.generate(request).images
    finally:
        engine.close()


@pytest.mark.parametrize("name", NAMES)
def test_generate_without_options_is_the_plain_pipeline_call(name, tiny_folder, tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    flags = ("--output", str(tmp_path / "x.mp4")) if name == "cogvideox" else ()
    request = _meshdit_request(tiny_folder(name), *flags)  # the model folder `meshdit generate --model` reads
    expected = _diffusers(tiny_pipeline(name))
    images = _meshdit(tiny_pipeline(name), request)
    assert images.shape == expected.shape, (request.height, request.width, request.num_frames)
    assert np.array_equal(images, expected), f"max abs diff {np.abs(images - expected).max()}"


def test_flux_without_guidance_embedding_runs_one_branch_unless_a_negative_prompt_is_given(tiny_folder):
    """FLUX.1 schnell-like: --guidance-scale is true_cfg_scale (default 1: one branch); Qwen-Image's default 4 runs
    true CFG only with a negative prompt, as diffusers' do_true_cfg."""
    from meshdit.models.info import ModelInfo

    flux, qwen = tiny_folder("flux"), tiny_folder("qwenimage")
    assert _meshdit_request(flux).guidance_scale == 1.0
    assert not ModelInfo.from_pretrained(flux).runs_cfg(None)
    assert _meshdit_request(qwen).guidance_scale == 1.0
    assert _meshdit_request(qwen, "--negative-prompt", "blurry").guidance_scale == 4.0


def test_cogvideox_image_to_video_takes_8_frames_as_diffusers_does():
    """diffusers' own CogVideoX image-to-video test input: 8 frames (two latent frames, decoded in a pair)."""
    from PIL import Image

    from meshdit.config import GenerateRequest

    image = Image.new("RGB", (80, 48), (200, 30, 30))
    size = dict(height=48, width=80, num_frames=8)
    expected = _diffusers(tiny_pipeline("cogvideox-i2v-ofs"), image=image, **size)
    request = GenerateRequest(prompt=PROMPT, num_inference_steps=1, image=image, **size)
    images = _meshdit(tiny_pipeline("cogvideox-i2v-ofs"), request)
    assert images.shape == expected.shape == (1, 8, 48, 80, 3)
    assert np.array_equal(images, expected), f"max abs diff {np.abs(images - expected).max()}"


def test_a_blank_prompt_is_encoded_as_diffusers_does(tiny_folder):
    """Unconditional generation: --prompt '' is taken (a warning says so) and equals pipe('')."""
    args = build_parser().parse_args(["generate", "--model", tiny_folder("sd3"), "--prompt", "", "--steps", "1"])
    request = generate_settings(args)[2]
    pipe = tiny_pipeline("sd3")
    pipe.set_progress_bar_config(disable=True)
    with torch.inference_mode():
        expected = pipe("", num_inference_steps=1, generator=torch.Generator("cpu").manual_seed(0),
                        output_type="np").images
    assert np.array_equal(_meshdit(tiny_pipeline("sd3"), request), expected)
