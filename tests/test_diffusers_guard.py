"""Guards against the next diffusers release.

1. With every degree 1, meshdit's loop gives the plain diffusers pipeline's image bit for bit, for
   every family: if a diffusers release changes a pipeline's arithmetic (timesteps, scaling,
   guidance), this fails before any parallel test can blame a strategy.
2. Where diffusers' transformer carries a `_cp_plan` (its own context-parallel plan), meshdit's
   sequence plan splits the same inputs along the same dims and gathers the same outputs.
"""
import numpy as np
import pytest
import torch

from meshdit.config import GenerateRequest
from meshdit.engine import Engine
from meshdit.models.registry import FAMILIES
from meshdit.testing.tiny_models import sample_image, tiny_flux_pipeline, tiny_pipeline

PROMPT = "a red cat on a blue square"
SIZE = dict(height=64, width=48, num_inference_steps=2)
TEXT = 16  # max_sequence_length, kept small for speed
PROMPT15 = 'a red cat saying "hi"'  # HunyuanVideo 1.5 encodes quoted text with ByT5 too
HUNYUANVIDEO_TEMPLATE = {"template": "{}", "crop_start": 0}
FLUX2_EMBEDS = torch.randn(1, 5, 32, generator=torch.Generator().manual_seed(7))  # tiny FLUX.2 has no text encoder

# name -> (pipeline builder, diffusers __call__ kwargs, meshdit guidance_scale, meshdit request extras)
CASES = {
    "flux": (lambda: tiny_pipeline("flux"), dict(prompt=PROMPT, max_sequence_length=TEXT), 1.0, {}),
    "flux-true-cfg": (lambda: tiny_pipeline("flux"),
                      dict(prompt=PROMPT, negative_prompt="", true_cfg_scale=3.0, max_sequence_length=TEXT), 3.0, {}),
    "flux-guidance-distilled": (lambda: tiny_flux_pipeline(guidance_embeds=True),
                                dict(prompt=PROMPT, guidance_scale=3.5, max_sequence_length=TEXT), 3.5, {}),
    "flux2": (lambda: tiny_pipeline("flux2"), dict(prompt_embeds=FLUX2_EMBEDS, guidance_scale=4.0), 4.0,
              {"prompt_embeds": FLUX2_EMBEDS}),
    "sd3": (lambda: tiny_pipeline("sd3"), dict(prompt=PROMPT, guidance_scale=5.0, max_sequence_length=TEXT), 5.0, {}),
    "sd35": (lambda: tiny_pipeline("sd35"), dict(prompt=PROMPT, guidance_scale=5.0, max_sequence_length=TEXT), 5.0,
             {}),
    "pixart-sigma": (lambda: tiny_pipeline("pixart-sigma"),
                     dict(prompt=PROMPT, guidance_scale=4.5, max_sequence_length=TEXT, use_resolution_binning=False),
                     4.5, {}),
    "pixart-alpha": (lambda: tiny_pipeline("pixart-alpha"),
                     dict(prompt=PROMPT, guidance_scale=4.5, max_sequence_length=TEXT, use_resolution_binning=False),
                     4.5, {}),
    "hunyuandit": (lambda: tiny_pipeline("hunyuandit"),
                   dict(prompt=PROMPT, guidance_scale=5.0, use_resolution_binning=False), 5.0, {}),
    # videos: 5 frames (2 latent frames); the frames come back as [1, F, H, W, 3]
    "wan": (lambda: tiny_pipeline("wan"),
            dict(prompt=PROMPT, guidance_scale=5.0, num_frames=5, max_sequence_length=TEXT), 5.0, {}),
    "wan22-two-experts": (lambda: tiny_pipeline("wan22"),
                          dict(prompt=PROMPT, guidance_scale=5.0, num_frames=5, max_sequence_length=TEXT), 5.0, {}),
    # image-to-video: its text length is fixed at 512 (no max_sequence_length); the image goes in as PIL
    "wan-i2v": (lambda: tiny_pipeline("wan-i2v"),
                dict(prompt=PROMPT, guidance_scale=5.0, num_frames=5, image=sample_image(64, 48)), 5.0, {}),
    # LTXPipeline asks for multiples of 32 pixels; its frame_rate is meshdit's fps (it scales the rotary positions)
    "ltx": (lambda: tiny_pipeline("ltx"),
            dict(prompt=PROMPT, guidance_scale=3.0, num_frames=9, max_sequence_length=TEXT), 3.0, {}),
    "ltx-8fps": (lambda: tiny_pipeline("ltx"),
                 dict(prompt=PROMPT, guidance_scale=3.0, num_frames=9, frame_rate=8, max_sequence_length=TEXT), 3.0,
                 {}),
    # LTX 0.9.1's recommended decode: timestep 0.05, latents mixed with 2.5 % noise
    "ltx-decode-timestep": (lambda: tiny_pipeline("ltx"),
                            dict(prompt=PROMPT, guidance_scale=3.0, num_frames=9, max_sequence_length=TEXT,
                                 decode_timestep=0.05, decode_noise_scale=0.025), 3.0,
                            {"decode_timestep": 0.05, "decode_noise_scale": 0.025}),
    # CogVideoX: 5B-shaped (rotary), 2B-shaped (sin-cos table: exactly 226 text tokens), the 5B's DPM scheduler
    "cogvideox": (lambda: tiny_pipeline("cogvideox"),
                  dict(prompt=PROMPT, guidance_scale=6.0, num_frames=5, max_sequence_length=TEXT), 6.0, {}),
    "cogvideox-sincos": (lambda: tiny_pipeline("cogvideox-sincos"),
                         dict(prompt=PROMPT, guidance_scale=6.0, num_frames=5), 6.0, {}),
    "cogvideox-dpm": (lambda: tiny_pipeline("cogvideox-dpm"),
                      dict(prompt=PROMPT, guidance_scale=6.0, num_frames=5, max_sequence_length=TEXT), 6.0, {}),
    # HunyuanVideo: the prompt (8 of 16 text tokens kept, the rest masked) joins every attention; distilled
    # (embedded guidance), or without guidance_embeds true CFG with a negative prompt
    "hunyuanvideo": (lambda: tiny_pipeline("hunyuanvideo"),
                     dict(prompt=PROMPT, guidance_scale=6.0, num_frames=5, max_sequence_length=TEXT), 6.0, {}),
    # the prompt_template of diffusers' own HunyuanVideo tests (meshdit: --extra prompt_template=...)
    "hunyuanvideo-prompt-template": (lambda: tiny_pipeline("hunyuanvideo"),
                                     dict(prompt=PROMPT, guidance_scale=6.0, num_frames=5, max_sequence_length=TEXT,
                                          prompt_template=HUNYUANVIDEO_TEMPLATE), 6.0,
                                     {"prompt_template": HUNYUANVIDEO_TEMPLATE}),
    "hunyuanvideo-true-cfg": (lambda: tiny_pipeline("hunyuanvideo-cfg"),
                              dict(prompt=PROMPT, negative_prompt="", true_cfg_scale=3.0, num_frames=5,
                                   max_sequence_length=TEXT), 3.0, {}),
    # HunyuanVideo 1.5: 1000 Qwen + 256 ByT5 (the quoted glyph text) + 729 image tokens, padding masked; CFG through
    # the pipeline's guider, whose scale (4.0) meshdit takes as its default (None); scale 1: one branch
    "hunyuanvideo15": (lambda: tiny_pipeline("hunyuanvideo15"), dict(prompt=PROMPT15, num_frames=5), None, {}),
    "hunyuanvideo15-no-cfg": (lambda: tiny_pipeline("hunyuanvideo15-nocfg"), dict(prompt=PROMPT15, num_frames=5),
                              None, {}),
}
SIZES = {"ltx": dict(SIZE, height=64, width=96), "ltx-8fps": dict(SIZE, height=64, width=96),
         "ltx-decode-timestep": dict(SIZE, height=64, width=96),
         # 3 steps: DPM's second-order update (its previous x0 prediction) runs from the second step on
         "cogvideox-dpm": dict(SIZE, num_inference_steps=3)}  # else SIZE


@pytest.mark.parametrize("name", list(CASES))
def test_every_degree_one_gives_the_diffusers_pipeline_image_bit_for_bit(name):
    build, diffusers_kwargs, guidance, extra = CASES[name]
    pipe = build()
    pipe.set_progress_bar_config(disable=True)
    size = SIZES.get(name, SIZE)
    with torch.inference_mode():
        output = pipe(**diffusers_kwargs, **size, generator=torch.Generator("cpu").manual_seed(3), output_type="np")
        expected = output.frames if hasattr(output, "frames") else output.images  # [1, H, W, 3], videos [1, F, ...]
    if "max_sequence_length" in diffusers_kwargs:
        extra = {**extra, "max_sequence_length": TEXT}
    request = GenerateRequest(prompt=diffusers_kwargs.get("prompt", PROMPT), **size, seed=3, guidance_scale=guidance, extra=extra,
                              num_frames=diffusers_kwargs.get("num_frames"), image=diffusers_kwargs.get("image"),
                              fps=diffusers_kwargs.get("frame_rate"))
    engine = Engine(pipe)
    try:
        images = engine.generate(request).images
    finally:
        engine.close()
    assert images.shape == expected.shape
    assert np.array_equal(images, expected), f"max abs diff {np.abs(images - expected).max()}"


# Entries of a _cp_plan that meshdit leaves whole, and why.
NOT_SPLIT = {
    # split only when the timestep is [B, S] (one per token: Wan 2.2 TI2V's expand_timesteps, which meshdit
    # refuses before ranks start); every other Wan model passes [B], which has no tokens to split
    "wan": {("", "timestep"): "per-token timesteps only"},
    # text stays whole on every rank: LTX's attn2 is cross-attention (LOCAL), so each rank's image tokens
    # attend to all of it without communication (diffusers shards it and lets its ring gather K/V)
    "ltx": {("", "encoder_hidden_states"): "text whole: cross-attention is local",
            ("", "encoder_attention_mask"): "text whole: cross-attention is local"},
}


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
    our_splits = {(s.module, s.arg): s.dim for s in ours.splits}
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

    assert family.tensor_parallel, f"{family.name}: its transformer has a _tp_plan, the registry row says no tp"
    transformer = tiny_pipeline(family.name).transformer
    names = {id(m): n for n, m in transformer.named_modules()}
    theirs = {}
    for block, relative in _resolve_tp_plan(transformer, _diffusers_tp_plan(family)):
        for path, style in relative.items():
            full = f"{names[id(block)]}.{path}" if names[id(block)] else path
            if isinstance(style, str):
                theirs[full] = {"colwise": COLUMN, "rowwise": ROW}[style]
            else:
                theirs[full] = COLUMN if isinstance(style, PackedColwiseParallel) else ROW
    plan = family.plan()
    ours = resolve(transformer, tensor_plan_for(transformer, plan.tensor), plan.stages)
    ours = {p: (s.style if isinstance(s, Packed) else s) for p, s in ours.items()}
    assert theirs, "diffusers resolved no module"
    missing = sorted(p for p in theirs if ours.get(p) != theirs[p])
    assert not missing, f"meshdit does not split these as diffusers' _tp_plan does: {missing}"
