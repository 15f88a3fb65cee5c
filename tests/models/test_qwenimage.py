"""Qwen-Image through the real CLI: a saved tiny model folder, Ulysses 2 against one process (the parametrised tests
cover every layout in process); the edit pipeline with --image; its refusals before ranks start."""
import subprocess
import sys

import numpy as np
import pytest

from meshdit.config import GenerateRequest, ParallelConfig
from meshdit.errors import ConfigError
from meshdit.models.info import ModelInfo
from meshdit.testing.tiny_models import tiny_pipeline

CLI = [sys.executable, "-m", "meshdit", "generate"]


def _generate(model, out, *flags):
    proc = subprocess.run(CLI + ["--model", str(model), "--prompt", "a red cat on a blue square", "--height", "64",
                                 "--width", "48", "--steps", "2", "--max-sequence-length", "16", "--output", str(out),
                                 *flags], capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return np.load(out)


def _ulysses_equals_one_process(model, tmp_path, *flags):
    serial = _generate(model, tmp_path / "serial.npy", *flags)
    parallel = _generate(model, tmp_path / "ulysses.npy", "--ulysses-degree", "2", *flags)
    assert serial.shape == (64, 48, 3)
    assert np.abs(parallel - serial).max() <= 1e-5 * np.abs(serial).max()


def test_text_to_image_cli_under_ulysses_2_equals_one_process(tiny_folder, tmp_path):
    model = tiny_folder("qwenimage")
    _ulysses_equals_one_process(model, tmp_path, "--negative-prompt", "blue", "--guidance-scale", "3")


def _info(name):
    return ModelInfo.from_pipeline(tiny_pipeline(name))


def test_edit_pipeline_needs_an_image_and_text_to_image_refuses_one(tmp_path):
    edit, t2i = _info("qwenimage-edit"), _info("qwenimage")
    request = GenerateRequest(prompt="a cat", height=64, width=48)
    with pytest.raises(ConfigError, match="--image PATH"):
        edit.check_request(ParallelConfig(), request)
    image = tmp_path / "in.png"
    image.write_bytes(b"")
    with pytest.raises(ConfigError, match="drop --image"):
        t2i.check_request(ParallelConfig(), GenerateRequest(prompt="a cat", height=64, width=48, image=str(image)))


def test_variants_the_plan_does_not_cover_are_refused():
    info = _info("qwenimage")
    for key in ("zero_cond_t", "use_layer3d_rope"):
        changed = ModelInfo(info.source, info.pipeline_class, info.family, {**info.transformer_config, key: True},
                            info.vae_scale_factor)
        with pytest.raises(ConfigError, match=key):
            changed.check_request(ParallelConfig(), GenerateRequest(prompt="a cat", height=64, width=48))


def test_cfg_parallel_needs_a_guidance_scale_above_one():
    with pytest.raises(ConfigError, match="guidance scale 1.0"):
        _info("qwenimage").check_request(ParallelConfig(cfg_degree=2),
                                         GenerateRequest(prompt="a cat", height=64, width=48, guidance_scale=1.0))


@pytest.mark.parametrize("degrees", [dict(ulysses_degree=2), dict(ring_degree=2, cfg_degree=2)], ids=["u2", "r2cfg2"])
def test_prompts_of_different_lengths_mask_the_text_padding_and_equal_one_process(run_ranks, degrees):
    """Two prompts of different token counts: the pipeline pads the shorter and masks its padding, so each joint
    attention gets a key mask over [text, image], which the leading MaskedTail takes under sequence parallelism."""
    import torch

    from tests.parallel import sp_jobs

    prompts = ["a red cat on a blue square", "a dog"]
    pipe = tiny_pipeline("qwenimage")
    _, mask = pipe.encode_prompt(prompt=prompts, device=torch.device("cpu"), max_sequence_length=16)
    assert mask is not None and not mask.all()  # the case this test is for: padding masked
    ref_out, ref_image = sp_jobs.generate_layout("qwenimage", {}, 36, 44, prompts=prompts)
    world = 1
    for degree in degrees.values():
        world *= degree
    for out, image in run_ranks(world, sp_jobs.generate_layout, "qwenimage", degrees, 36, 44, prompts=prompts):
        assert (out - ref_out).abs().max().item() <= 1e-5 * ref_out.abs().max().item()
        assert np.abs(image - ref_image).max() <= 1e-5 * np.abs(ref_image).max()


EDIT_LAYOUTS = {  # the edit pipeline beyond the parametrised tests' Ulysses 2 x ring 2 (its variants run)
    "r2": (dict(ring_degree=2), 1),
    "cfg2": (dict(cfg_degree=2), 1),
    "dp2": (dict(data_parallel_degree=2), 2),
    "u2-parallel-vae": (dict(ulysses_degree=2), 1),
}
_EDIT_REFERENCE: dict = {}


@pytest.mark.parametrize("layout", list(EDIT_LAYOUTS))
def test_edit_pipeline_under_every_layout_equals_one_process(run_ranks, layout):
    """The reference tokens, split with the image stream, under ring, CFG, data parallelism, PipeFusion (full
    warmup: every step whole) and the parallel VAE, on 9 x 11 noise tokens (+ 82 x 50 reference tokens)."""
    from meshdit.config import ParallelConfig as Layout
    from tests.parallel import sp_jobs

    degrees, per_prompt = EDIT_LAYOUTS[layout]
    vae = dict(parallel=True) if layout == "u2-parallel-vae" else None
    if per_prompt not in _EDIT_REFERENCE:
        _EDIT_REFERENCE[per_prompt] = sp_jobs.generate_layout("qwenimage-edit", {}, 36, 44, per_prompt=per_prompt)
    ref_out, ref_image = _EDIT_REFERENCE[per_prompt]
    request_only = ("warmup_steps", "num_pipeline_patch")
    world = Layout(**{k: v for k, v in degrees.items() if k not in request_only}).world_size
    for out, image in run_ranks(world, sp_jobs.generate_layout, "qwenimage-edit", degrees, 36, 44,
                                per_prompt=per_prompt, vae=vae):
        if out.shape == ref_out.shape:  # (a data-parallel rank's first-step output covers its share only)
            assert (out - ref_out).abs().max().item() <= 1e-5 * ref_out.abs().max().item()
        assert image.shape == ref_image.shape
        assert np.abs(image - ref_image).max() <= 1e-5 * np.abs(ref_image).max()


def test_edit_pipeline_under_pipefusion_with_full_warmup_equals_one_process(run_ranks):
    """Whole-grid windows keep the reference tokens after the grid (a fresh pipeline: PipeFusion drops blocks)."""
    from tests.parallel import sp_jobs

    ref = sp_jobs.generate_fresh("qwenimage-edit", {}, 36, 44)[0]
    degrees = dict(pipefusion_parallel_degree=2, warmup_steps=2, num_pipeline_patch=2)
    for image, _, _ in run_ranks(2, sp_jobs.generate_fresh, "qwenimage-edit", degrees, 36, 44):
        assert np.abs(image - ref).max() <= 1e-5 * np.abs(ref).max()


def test_edit_pipeline_refuses_pipefusion_patch_steps(tmp_path):
    from meshdit.models.tiny.parts import sample_image

    image = tmp_path / "in.png"
    sample_image().save(image)  # a real image: the check opens it before the layout's rules
    request = GenerateRequest(prompt="a cat", height=64, width=48, image=str(image), num_inference_steps=4,
                              warmup_steps=1)
    with pytest.raises(ConfigError, match="--warmup-steps 4"):
        _info("qwenimage-edit").check_request(ParallelConfig(pipefusion_parallel_degree=2), request)
    _info("qwenimage").check_request(ParallelConfig(pipefusion_parallel_degree=2), GenerateRequest(
        prompt="a cat", height=64, width=48, num_inference_steps=4, warmup_steps=1))  # text-to-image: patches run
