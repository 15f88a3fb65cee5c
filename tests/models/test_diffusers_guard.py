"""Guards against the next diffusers release.

1. With every degree 1, meshdit's loop gives the plain diffusers pipeline's image bit for bit, for
   every family: if a diffusers release changes a pipeline's arithmetic (timesteps, scaling,
   guidance), this fails before any parallel test can blame a strategy.
2. Where diffusers' transformer carries a `_cp_plan` (its own context-parallel plan), meshdit's
   sequence plan splits the same inputs along the same dims and gathers the same outputs.
"""
import inspect

import numpy as np
import pytest
import torch

from meshdit.config import GenerateRequest
from meshdit.engine import Engine
from meshdit.models.registry import FAMILIES
from meshdit.models.tiny import GUARD_PROMPT, GUARD_SIZE, GUARD_TEXT
from meshdit.testing.tiny_models import tiny_families, tiny_pipeline

# every family's cases (its tiny module's GUARD_CASES): name -> models.tiny.GuardCase
CASES = {name: case for _, module in tiny_families() for name, case in module.GUARD_CASES.items()}


@pytest.mark.parametrize("name", list(CASES))
def test_every_degree_one_gives_the_diffusers_pipeline_image_bit_for_bit(name):
    case = CASES[name]
    diffusers_kwargs, guidance, extra = case.call, case.guidance, case.extra
    pipe = tiny_pipeline(case.build)
    pipe.set_progress_bar_config(disable=True)
    size = {**GUARD_SIZE, **case.size}
    # a pipeline without height / width (HunyuanVideo 1.5 I2V: the bucket of its image's aspect ratio) takes none
    takes = inspect.signature(pipe.__call__).parameters
    with torch.inference_mode():
        output = pipe(**diffusers_kwargs, **{k: v for k, v in size.items() if k in takes},
                      generator=torch.Generator("cpu").manual_seed(3), output_type="np")
        expected = output.frames if hasattr(output, "frames") else output.images  # [1, H, W, 3], videos [1, F, ...]
    if "max_sequence_length" in diffusers_kwargs:
        extra = {**extra, "max_sequence_length": GUARD_TEXT}
    request = GenerateRequest(prompt=diffusers_kwargs.get("prompt", GUARD_PROMPT), **size, seed=3,
                              guidance_scale=guidance, extra=extra, num_frames=diffusers_kwargs.get("num_frames"),
                              image=diffusers_kwargs.get("image"), fps=diffusers_kwargs.get("frame_rate"))
    engine = Engine(pipe)
    try:
        images = engine.generate(request).images
    finally:
        engine.close()
    assert images.shape == expected.shape
    assert np.array_equal(images, expected), f"max abs diff {np.abs(images - expected).max()}"


# Entries of a _cp_plan that meshdit leaves whole, and why: each family's tiny module's CP_PLAN_NOT_SPLIT.
NOT_SPLIT = {family.name: getattr(module, "CP_PLAN_NOT_SPLIT", {}) for family, module in tiny_families()}
# Splits of meshdit's plan that a _cp_plan lacks, and why: each tiny module's PLAN_NOT_IN_CP_PLAN (LTX's per-token
# timestep of image-to-video).
NOT_IN_CP_PLAN = {family.name: getattr(module, "PLAN_NOT_IN_CP_PLAN", {}) for family, module in tiny_families()}


def _diffusers_cp_plan(family):
    import diffusers

    return getattr(getattr(diffusers, family.transformer_class), "_cp_plan", None)


@pytest.mark.parametrize("family", [f for f in FAMILIES if _diffusers_cp_plan(f)], ids=lambda f: f.name)
def test_sequence_plan_names_the_inputs_and_outputs_of_the_diffusers_cp_plan(family):
    from diffusers.models._modeling_parallel import ContextParallelInput, ContextParallelOutput

    from meshdit.parallel.plan import OUTPUT

    cp_plan = _diffusers_cp_plan(family)
    ours = family.plan().sequence
    # diffusers: {"": {arg: ContextParallelInput(split_dim, expected_dims)}, "proj_out": ContextParallelOutput(...)};
    # an int key with split_output=True splits that item of the module's output (Wan's rope: (cos, sin))
    their_splits, their_gathers = {}, {}
    for module, entry in cp_plan.items():
        if isinstance(entry, ContextParallelOutput):
            their_gathers[module] = entry.gather_dim - entry.expected_dims  # as a dim from the end
        else:
            for arg, spec in entry.items():
                assert isinstance(spec, ContextParallelInput)
                if (module, arg) in NOT_SPLIT.get(family.name, {}):
                    continue
                key = (module, OUTPUT) if spec.split_output else (module, arg)
                their_splits[key] = spec.split_dim - spec.expected_dims
    our_splits = {(s.module, s.arg): s.dim for s in ours.splits
                  if (s.module, s.arg) not in NOT_IN_CP_PLAN.get(family.name, {})}
    our_gathers = {g.module: g.dim for g in ours.gathers}
    assert our_splits == their_splits
    assert our_gathers == their_gathers


def _diffusers_tp_plan(family):
    import diffusers

    return getattr(getattr(diffusers, family.transformer_class), "_tp_plan", None)


@pytest.mark.parametrize("family", [f for f in FAMILIES if _diffusers_tp_plan(f)], ids=lambda f: f.name)
def test_tensor_plan_splits_what_the_diffusers_tp_plan_names(family):
    """Every Linear diffusers' `_tp_plan` shards (resolved by diffusers' own glob rules) meshdit splits the same
    way (column / row, packed alike); meshdit may split more (the modulation it gathers)."""
    from diffusers.hooks.tensor_parallel import PackedColwiseParallel, _resolve_tp_plan

    from meshdit.parallel.plan import COLUMN, ROW, Packed
    from meshdit.parallel.tensor import resolve, tensor_plan_for

    assert family.parallel.tensor, f"{family.name}: its transformer has a _tp_plan, the registry row says no tp"
    transformer = tiny_pipeline(family.name).transformer
    names = {id(m): n for n, m in transformer.named_modules()}
    theirs = {}
    for block, relative in _resolve_tp_plan(transformer, _diffusers_tp_plan(family)):
        for path, style in relative.items():
            full = f"{names[id(block)]}.{path}" if names[id(block)] else path
            if isinstance(style, str):
                theirs[full] = {"colwise": COLUMN, "rowwise": ROW}[style]
            else:
                theirs[full] = ("packed", COLUMN if isinstance(style, PackedColwiseParallel) else ROW)
    plan = family.plan()
    ours = resolve(transformer, tensor_plan_for(transformer, plan.tensor), plan.stages)
    ours = {p: (("packed", s.style) if isinstance(s, Packed) else s) for p, s in ours.items()}
    assert theirs, "diffusers resolved no module"
    missing = sorted(p for p in theirs if ours.get(p) != theirs[p])
    assert not missing, f"meshdit does not split these as diffusers' _tp_plan does: {missing}"


def test_cogvideox_image_to_video_of_several_videos_is_the_pipeline_given_the_image_per_video():
    """CogVideoXImageToVideoPipeline takes one image per video (it encodes each, sampling its latent distribution in
    turn); meshdit's one --image for two prompts equals the pipeline given that image twice, bit for bit."""
    from meshdit.testing.tiny_models import sample_image

    pipe = tiny_pipeline("cogvideox-i2v-ofs")
    pipe.set_progress_bar_config(disable=True)
    image, prompts = sample_image(GUARD_SIZE["height"], GUARD_SIZE["width"]), ["a red cat", "a blue dog"]
    with torch.inference_mode():
        expected = pipe(image=[image, image], prompt=prompts, guidance_scale=6.0, num_frames=5, **GUARD_SIZE,
                        max_sequence_length=GUARD_TEXT, generator=torch.Generator("cpu").manual_seed(3),
                        output_type="np").frames
    engine = Engine(pipe)
    try:
        videos = engine.generate(GenerateRequest(prompt=prompts, **GUARD_SIZE, seed=3, guidance_scale=6.0, num_frames=5,
                                                 image=image, extra={"max_sequence_length": GUARD_TEXT})).images
    finally:
        engine.close()
    assert videos.shape == expected.shape and not np.array_equal(videos[0], videos[1])
    assert np.array_equal(videos, expected)
