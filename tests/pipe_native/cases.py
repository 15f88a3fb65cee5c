"""One tiny pipeline and one call per pipeline class, for the pipe-native exactness tests.

Each class is built from its family's tiny pipeline's components (meshdit/models/tiny/<family>.py), so the weights
are those the other tests use; the call exercises the keywords diffusers users pass (negative prompts, several
images per prompt, a callback that edits the latents, given latents or prompt embeddings, input images, masks,
strength), spread over the classes to keep the run short.
"""
from __future__ import annotations

import inspect
from dataclasses import dataclass, field
from typing import Callable

import torch

from meshdit.testing.tiny_models import sample_image, tiny_pipeline


def halve_latents(pipe, step, timestep, kwargs):
    """A callback_on_step_end that edits the latents (every rank runs it on its replicated latents)."""
    return {"latents": kwargs["latents"] * 0.9}


def mask_image(height: int, width: int):
    from PIL import Image

    mask = torch.zeros(height, width, dtype=torch.uint8)
    mask[height // 4: 3 * height // 4, width // 3:] = 255
    return Image.fromarray(mask.numpy())


def other_image(height: int, width: int):
    """A second picture (the sample flipped): a control image apart from the input image."""
    from PIL import Image

    return sample_image(height, width).transpose(Image.FLIP_LEFT_RIGHT)


def retyped(build: str, cls: str, **extra) -> Callable:
    """The tiny pipeline `build`'s components made into diffusers' class `cls` (its other components None)."""
    def make():
        import diffusers

        base = tiny_pipeline(build)
        target = getattr(diffusers, cls)
        parameters = inspect.signature(target.__init__).parameters
        components = {name: base.components.get(name) for name in parameters if name != "self"
                      and parameters[name].default is inspect.Parameter.empty}
        components.update({name: base.components[name] for name in parameters
                           if name in base.components and name not in components})
        return target(**components, **extra)
    return make


@dataclass(frozen=True)
class Case:
    build: Callable
    call: Callable[[], dict]
    """The keywords of the call (besides generator and output_type)."""
    steps: int = 2
    cache: dict = field(default_factory=dict)
    """CacheSettings fields of the "cache" layout (default: jobs.CACHE's); SD3's last block returns no text, so it
    must run (dbcache, a back block)."""


def sd3_inpaint():
    """SD3's inpaint pipeline asks for 16 latent channels (or 33: the inpainting model's), as SD3's VAE has."""
    from diffusers import FlowMatchEulerDiscreteScheduler, SD3Transformer2DModel, StableDiffusion3InpaintPipeline

    from meshdit.models.tiny.parts import tiny_vae

    base = tiny_pipeline("sd35")
    torch.manual_seed(0)
    transformer = SD3Transformer2DModel(
        sample_size=16, patch_size=2, in_channels=16, num_layers=2, attention_head_dim=8, num_attention_heads=4,
        joint_attention_dim=32, caption_projection_dim=32, pooled_projection_dim=32, out_channels=16,
        pos_embed_max_size=32, dual_attention_layers=(0,), qk_norm="rms_norm").eval()
    components = dict(base.components, transformer=transformer, vae=tiny_vae(latent_channels=16),
                      scheduler=FlowMatchEulerDiscreteScheduler(shift=3.0))
    return StableDiffusion3InpaintPipeline(**{k: v for k, v in components.items()
                                              if k not in ("image_encoder", "feature_extractor")})


FLUX_TEXT = dict(prompt="a red cat", max_sequence_length=6, height=32, width=48)
SD3_TEXT = dict(prompt="a red cat", max_sequence_length=6, height=32, width=48, guidance_scale=5.0)


def _user_latents(shape, seed=5):
    return torch.randn(shape, generator=torch.Generator().manual_seed(seed))


CASES: dict[str, Case] = {
    "FluxPipeline": Case(lambda: tiny_pipeline("flux"), lambda: dict(
        FLUX_TEXT, negative_prompt="a dog", true_cfg_scale=3.0, num_images_per_prompt=2,
        callback_on_step_end=halve_latents)),
    "FluxImg2ImgPipeline": Case(retyped("flux", "FluxImg2ImgPipeline"), lambda: dict(
        FLUX_TEXT, image=sample_image(32, 48), strength=0.7, num_inference_steps=3), steps=3),
    "FluxInpaintPipeline": Case(retyped("flux", "FluxInpaintPipeline"), lambda: dict(
        FLUX_TEXT, image=sample_image(32, 48), mask_image=mask_image(32, 48), strength=0.8,
        negative_prompt="a dog", true_cfg_scale=2.0), steps=3),
    "FluxKontextPipeline": Case(lambda: tiny_pipeline("kontext"), lambda: dict(
        FLUX_TEXT, image=sample_image(32, 48), _auto_resize=False, max_area=32 * 48)),
    "FluxKontextInpaintPipeline": Case(retyped("kontext", "FluxKontextInpaintPipeline"), lambda: dict(
        FLUX_TEXT, image=sample_image(32, 48), mask_image=mask_image(32, 48), strength=0.9, _auto_resize=False, max_area=32 * 48),
        steps=3),
    "StableDiffusion3Pipeline": Case(lambda: tiny_pipeline("sd35-4blocks"), lambda: dict(
        SD3_TEXT, negative_prompt="a dog", num_images_per_prompt=2, callback_on_step_end=halve_latents),
        cache=dict(method="dbcache", front_blocks=1, back_blocks=1, warmup=1, threshold=10.0)),
    "StableDiffusion3Img2ImgPipeline": Case(retyped("sd35", "StableDiffusion3Img2ImgPipeline"), lambda: dict(
        SD3_TEXT, image=sample_image(32, 48), strength=0.7), steps=3),
    "StableDiffusion3InpaintPipeline": Case(lambda: sd3_inpaint(), lambda: dict(
        SD3_TEXT, image=sample_image(32, 48), mask_image=mask_image(32, 48), strength=0.9), steps=3),
    "PixArtSigmaPipeline": Case(lambda: tiny_pipeline("pixart-sigma"), lambda: dict(
        prompt="a red cat", max_sequence_length=6, height=32, width=48, use_resolution_binning=False,
        latents=_user_latents((1, 4, 16, 24)))),
    "PixArtAlphaPipeline": Case(lambda: tiny_pipeline("pixart-alpha"), lambda: dict(
        prompt="a red cat", max_sequence_length=6, height=32, width=48, use_resolution_binning=False,
        num_images_per_prompt=2)),
    "ChromaPipeline": Case(lambda: tiny_pipeline("chroma"), lambda: dict(
        FLUX_TEXT, negative_prompt="a dog", guidance_scale=3.0)),
    "ChromaImg2ImgPipeline": Case(retyped("chroma", "ChromaImg2ImgPipeline"), lambda: dict(
        FLUX_TEXT, image=sample_image(32, 48), strength=0.7, guidance_scale=3.0), steps=3),
    "QwenImagePipeline": Case(lambda: tiny_pipeline("qwenimage"), lambda: dict(
        prompt="a red cat", max_sequence_length=6, height=128, width=192, negative_prompt="a dog",
        true_cfg_scale=3.0)),
    "QwenImageImg2ImgPipeline": Case(retyped("qwenimage", "QwenImageImg2ImgPipeline"), lambda: dict(
        prompt="a red cat", max_sequence_length=6, height=128, width=192, image=sample_image(128, 192),
        strength=0.7), steps=3),
    "QwenImageInpaintPipeline": Case(retyped("qwenimage", "QwenImageInpaintPipeline"), lambda: dict(
        prompt="a red cat", max_sequence_length=6, height=128, width=192, image=sample_image(128, 192),
        mask_image=mask_image(128, 192), strength=0.9), steps=3),
    "HunyuanDiTPipeline": Case(lambda: tiny_pipeline("hunyuandit"), lambda: dict(
        prompt="a red cat", height=128, width=192, guidance_scale=5.0, use_resolution_binning=False)),
    "SanaPipeline": Case(lambda: tiny_pipeline("sana"), lambda: dict(
        prompt="a red cat", max_sequence_length=6, height=128, width=192, guidance_scale=4.5,
        complex_human_instruction=None, use_resolution_binning=False)),
    "Flux2Pipeline": Case(lambda: tiny_pipeline("flux2"), lambda: dict(
        prompt_embeds=torch.randn(1, 5, 32, generator=torch.Generator().manual_seed(7)), height=32, width=48,
        guidance_scale=4.0)),
}


def _guard_cases() -> dict[str, Case]:
    """The other families' classes: the first degree-1 guard case of each pipeline class not above
    (meshdit/models/tiny/<family>.py GUARD_CASES: the plain diffusers call meshdit's recipes are checked against)."""
    import importlib

    from meshdit.models.registry import FAMILIES
    from meshdit.models.tiny import GUARD_SIZE

    found: dict[str, Case] = {}
    for family in FAMILIES:
        module = importlib.import_module(family.modules.tiny)
        for guard in module.GUARD_CASES.values():
            cls = _class_of(family, guard.build)
            if cls in CASES or cls in found:
                continue
            found[cls] = Case(lambda build=guard.build: tiny_pipeline(build),
                              lambda guard=guard: dict(guard.call, **{k: v for k, v in {**GUARD_SIZE, **guard.size}
                                                                      .items() if k != "num_inference_steps"}),
                              steps=guard.size.get("num_inference_steps", GUARD_SIZE["num_inference_steps"]))
    return found


def _class_of(family, build: str) -> str:
    """The pipeline class a tiny build makes, from the builder's own module without building it: the one of the
    family's pipeline classes whose name the build's words suggest (i2v, edit, condition), else the first."""
    words = build.split("-")
    for cls in family.pipeline_classes[1:]:
        lowered = cls.lower()
        if ("i2v" in words and "imagetovideo" in lowered) or ("edit" in words and "edit" in lowered) or (
                "condition" in words and "condition" in lowered) or ("alpha" in words and "alpha" in lowered):
            return cls
    return family.pipeline_classes[0]


CASES.update(_guard_cases())


def _variant_cases() -> dict[str, Case]:
    """ControlNet, PAG, control / fill and edit variants (their tiny pipelines: variant_cases.py)."""
    from tests.pipe_native import variant_cases as v

    image, mask = (lambda: sample_image(32, 48)), (lambda: mask_image(32, 48))
    sd3 = dict(SD3_TEXT, negative_prompt="a dog")
    return {
        "FluxControlPipeline": Case(v.flux_channels("FluxControlPipeline", 32), lambda: dict(
            FLUX_TEXT, control_image=image(), guidance_scale=3.0, num_images_per_prompt=2)),
        "FluxControlImg2ImgPipeline": Case(v.flux_channels("FluxControlImg2ImgPipeline", 32), lambda: dict(
            FLUX_TEXT, image=image(), control_image=other_image(32, 48), strength=0.8), steps=3),
        "FluxControlInpaintPipeline": Case(v.flux_channels("FluxControlInpaintPipeline", 32), lambda: dict(
            FLUX_TEXT, image=image(), control_image=other_image(32, 48), mask_image=mask(),
            strength=0.9), steps=3),
        "FluxFillPipeline": Case(v.flux_channels("FluxFillPipeline", 48), lambda: dict(
            FLUX_TEXT, image=image(), mask_image=mask(), callback_on_step_end=halve_latents)),
        "FluxControlNetPipeline": Case(v.flux_controlnet("FluxControlNetPipeline"), lambda: dict(  # 9 x 11 tokens
            FLUX_TEXT, height=36, width=44, control_image=sample_image(36, 44), controlnet_conditioning_scale=0.8,
            negative_prompt="a dog", true_cfg_scale=2.0)),
        "FluxControlNetImg2ImgPipeline": Case(v.flux_controlnet("FluxControlNetImg2ImgPipeline"), lambda: dict(
            FLUX_TEXT, image=image(), control_image=other_image(32, 48), strength=0.8), steps=3),
        "FluxControlNetInpaintPipeline": Case(v.flux_controlnet("FluxControlNetInpaintPipeline"), lambda: dict(
            FLUX_TEXT, image=image(), mask_image=mask(), control_image=other_image(32, 48),
            strength=0.9), steps=3),
        "StableDiffusion3ControlNetPipeline": Case(v.sd3_controlnet("StableDiffusion3ControlNetPipeline"),
                                                   lambda: dict(sd3, control_image=image())),
        "StableDiffusion3ControlNetInpaintingPipeline": Case(
            v.sd3_controlnet("StableDiffusion3ControlNetInpaintingPipeline", extra_channels=1),
            lambda: dict(sd3, control_image=image(), control_mask=mask())),
        "StableDiffusion3PAGPipeline": Case(v.pag("sd35-4blocks", "StableDiffusion3PAGPipeline", ["blocks.1"]),
                                            lambda: dict(sd3, pag_scale=2.0)),
        "StableDiffusion3PAGImg2ImgPipeline": Case(
            v.pag("sd35-4blocks", "StableDiffusion3PAGImg2ImgPipeline", ["blocks.1"]),
            lambda: dict(sd3, image=image(), strength=0.8, pag_scale=2.0), steps=3),
        "PixArtSigmaPAGPipeline": Case(v.pag("pixart-sigma", "PixArtSigmaPAGPipeline", ["blocks.1"]), lambda: dict(
            prompt="a red cat", max_sequence_length=6, height=32, width=48, use_resolution_binning=False,
            pag_scale=2.0)),
        "HunyuanDiTPAGPipeline": Case(v.pag("hunyuandit", "HunyuanDiTPAGPipeline", ["blocks.1"]), lambda: dict(
            prompt="a red cat", height=128, width=192, guidance_scale=5.0, use_resolution_binning=False,
            pag_scale=2.0)),
        "HunyuanDiTControlNetPipeline": Case(v.hunyuandit_controlnet, lambda: dict(
            prompt="a red cat", height=128, width=192, guidance_scale=5.0, use_resolution_binning=False,
            control_image=sample_image(128, 192))),
        "SanaControlNetPipeline": Case(v.sana_controlnet, lambda: dict(
            prompt="a red cat", max_sequence_length=6, height=96, width=160, guidance_scale=4.5,  # 3 latent rows
            complex_human_instruction=None, use_resolution_binning=False, control_image=sample_image(96, 160))),
        "QwenImageControlNetPipeline": Case(v.qwenimage_controlnet("QwenImageControlNetPipeline"), lambda: dict(
            prompt="a red cat", max_sequence_length=6, height=128, width=192, negative_prompt="a dog",
            true_cfg_scale=3.0, control_image=sample_image(128, 192))),
        "QwenImageControlNetInpaintPipeline": Case(
            v.qwenimage_controlnet("QwenImageControlNetInpaintPipeline", extra_channels=4), lambda: dict(
                prompt="a red cat", max_sequence_length=6, height=128, width=192,
                control_image=sample_image(128, 192), control_mask=mask_image(128, 192))),
    }


CASES.update(_variant_cases())


def _variant_cases_2() -> dict[str, Case]:
    """Edit, video-to-video and distilled variants."""
    from tests.pipe_native import variant_cases as v

    qwen = dict(prompt="a red cat", max_sequence_length=6, height=128, width=192)
    video = dict(prompt="a red cat", max_sequence_length=16, height=64, width=48)
    return {
        "QwenImageEditPlusPipeline": Case(retyped("qwenimage-edit", "QwenImageEditPlusPipeline"), lambda: dict(
            qwen, image=[sample_image(128, 192), other_image(128, 192)], negative_prompt="a dog",
            true_cfg_scale=2.0)),
        "QwenImageEditInpaintPipeline": Case(retyped("qwenimage-edit", "QwenImageEditInpaintPipeline"), lambda: dict(
            qwen, image=sample_image(128, 192), mask_image=mask_image(128, 192), strength=0.9), steps=3),
        "SanaSprintPipeline": Case(v.retransformed("sana", "SanaSprintPipeline", v.scm_scheduler, guidance_embeds=True,
                                                   qk_norm="rms_norm_across_heads"), lambda: dict(
            prompt="a red cat", max_sequence_length=6, height=128, width=160, complex_human_instruction=None,
            use_resolution_binning=False)),
        "SanaSprintImg2ImgPipeline": Case(v.retransformed("sana", "SanaSprintImg2ImgPipeline", v.scm_scheduler, guidance_embeds=True,
                                                          qk_norm="rms_norm_across_heads"), lambda: dict(
            prompt="a red cat", max_sequence_length=6, height=128, width=160, complex_human_instruction=None,
            use_resolution_binning=False, image=sample_image(128, 160), strength=0.8)),
        "CogVideoXVideoToVideoPipeline": Case(retyped("cogvideox", "CogVideoXVideoToVideoPipeline"), lambda: dict(
            video, video=v.video(5, 64, 48), strength=0.8, guidance_scale=6.0), steps=3),
        "CogVideoXFunControlPipeline": Case(v.retransformed("cogvideox", "CogVideoXFunControlPipeline",
                                                            in_channels=8), lambda: dict(
            video, control_video=v.video(5, 64, 48), guidance_scale=6.0)),
        "WanVideoToVideoPipeline": Case(retyped("wan", "WanVideoToVideoPipeline"), lambda: dict(
            video, video=v.video(5, 64, 48), strength=0.8, guidance_scale=5.0), steps=3),
        "LucyEditPipeline": Case(v.retransformed("wan", "LucyEditPipeline", in_channels=32), lambda: dict(
            video, video=v.video(5, 64, 48), num_frames=5, guidance_scale=5.0)),
        "HunyuanSkyreelsImageToVideoPipeline": Case(
            v.retransformed("hunyuanvideo-cfg", "HunyuanSkyreelsImageToVideoPipeline", in_channels=8), lambda: dict(
                prompt="a red cat", max_sequence_length=16, height=64, width=48, num_frames=5,
                image=sample_image(64, 48), negative_prompt="a dog", true_cfg_scale=2.0,
                prompt_template={"template": "{}", "crop_start": 0})),
        "Flux2KleinPipeline": Case(retyped("flux2", "Flux2KleinPipeline", is_distilled=True), lambda: dict(
            prompt_embeds=torch.randn(1, 5, 32, generator=torch.Generator().manual_seed(7)), height=32, width=48)),
        "Flux2KleinInpaintPipeline": Case(retyped("flux2", "Flux2KleinInpaintPipeline", is_distilled=True), lambda: dict(
            prompt_embeds=torch.randn(1, 5, 32, generator=torch.Generator().manual_seed(7)), height=32, width=48,
            image=sample_image(32, 48), mask_image=mask_image(32, 48), image_reference=other_image(32, 48),
            strength=0.9), steps=3),
    }


CASES.update(_variant_cases_2())
# LTXPipeline with its own case (not the guard one): a negative prompt and uneven splits. (num_videos_per_prompt=2
# fails in its VAE decode in one process too with the tiny VAE.)
CASES["LTXPipeline"] = Case(lambda: tiny_pipeline("ltx"), lambda: dict(  # 3 x 3 x 3 tokens: uneven on 2 ranks
    prompt="a red cat", negative_prompt="a dog", max_sequence_length=16, height=96, width=96, num_frames=17,
    guidance_scale=3.0))


def _visual_cloze_cases() -> dict[str, Case]:
    """VisualCloze: FLUX.1 Fill's transformer over a grid of in-context examples and the query (its target None)."""
    from tests.pipe_native import variant_cases as v

    def grid():
        return [[sample_image(32, 32), other_image(32, 32)], [other_image(32, 32), None]]

    call = dict(task_prompt="make it red", content_prompt="a red cat", max_sequence_length=6, guidance_scale=3.0)
    return {
        "VisualClozeGenerationPipeline": Case(v.retransformed("flux", "VisualClozeGenerationPipeline",
                                                              lambda: dict(resolution=32), in_channels=48,
                                                              out_channels=16), lambda: dict(call, image=grid())),
        "VisualClozePipeline": Case(v.retransformed("flux", "VisualClozePipeline", lambda: dict(resolution=32),
                                                    in_channels=48, out_channels=16),
                                    lambda: dict(call, image=grid(), upsampling_strength=0.0)),
    }


CASES.update(_visual_cloze_cases())
def _static_shift():
    from diffusers import FlowMatchEulerDiscreteScheduler

    return dict(scheduler=FlowMatchEulerDiscreteScheduler())  # its __call__ passes no mu: no dynamic shifting


CASES["LTXI2VLongMultiPromptPipeline"] = Case(__import__("tests.pipe_native.variant_cases").pipe_native.variant_cases
                                              .retransformed("ltx", "LTXI2VLongMultiPromptPipeline", _static_shift),
                                              lambda: dict(
    prompt="a red cat", negative_prompt="a dog", max_sequence_length=16, height=64, width=96, num_frames=17,
    guidance_scale=3.0, cond_image=sample_image(64, 96), temporal_tile_size=16, temporal_overlap=8,
    decode_horizontal_tiles=1, decode_vertical_tiles=1))
CASES["QwenImageLayeredPipeline"] = Case(__import__("tests.pipe_native.variant_cases").pipe_native.variant_cases
                                         .retransformed("qwenimage-edit", "QwenImageLayeredPipeline",
                                                        use_layer3d_rope=True), lambda: dict(
    prompt="a red cat", max_sequence_length=6, image=sample_image(64, 64), layers=1, resolution=640,
    negative_prompt="a dog", true_cfg_scale=2.0), steps=1)
