"""Cases of the pipeline variants over a family's transformer: ControlNet pipelines (their ControlNet model built
from the family's tiny transformer), PAG, control / fill inputs concatenated on channels, edit and video-to-video.

A ControlNet runs whole on every rank (it is not hooked); its per-block residuals enter the transformer as
arguments that the family's sequence plan splits like the image tokens (meshdit/models/<family>.py). diffusers
zero-initialises a ControlNet's output blocks, so every all-zero weight here is drawn at random: a residual split
wrong (or not at all) shows in the image.
"""
from __future__ import annotations

import torch

from meshdit.testing.tiny_models import sample_image, tiny_pipeline


def _randomize_zeros(model, seed: int = 11):
    """The weights diffusers zero-initialises (ControlNet output blocks) drawn small and random instead."""
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for parameter in model.parameters():
            if not parameter.abs().any():
                parameter.copy_(torch.randn(parameter.shape, generator=generator) * 0.1)
    return model.eval()


def _components(base, cls, **extra):
    """base's components that diffusers' class `cls` takes, with `extra` (others None)."""
    import inspect

    import diffusers

    target = getattr(diffusers, cls)
    parameters = inspect.signature(target.__init__).parameters
    components = {name: base.components.get(name) for name in parameters if name != "self"
                  and parameters[name].default is inspect.Parameter.empty}
    components.update({name: base.components[name] for name in parameters
                       if name in base.components and name not in components})
    components.update(extra)
    return target(**components)


def flux_channels(cls: str, in_channels: int):
    """FLUX.1 Control / Fill: the tiny transformer taking `in_channels` (the latents and their condition, packed,
    side by side on channels) and giving the 16 of the latents."""
    def make():
        from diffusers import FluxTransformer2DModel

        base = tiny_pipeline("flux")
        torch.manual_seed(1)
        transformer = FluxTransformer2DModel.from_config(base.transformer.config, in_channels=in_channels,
                                                         out_channels=16).eval()
        return _components(base, cls, transformer=transformer)
    return make


def flux_controlnet(cls: str):
    def make():
        from diffusers import FluxControlNetModel

        base = tiny_pipeline("flux-4blocks")
        torch.manual_seed(2)
        controlnet = FluxControlNetModel.from_transformer(base.transformer, num_layers=1, num_single_layers=1,
                                                          attention_head_dim=16, num_attention_heads=4)
        return _components(base, cls, controlnet=_randomize_zeros(controlnet))
    return make


def sd3_controlnet(cls: str, extra_channels: int = 0):
    def make():
        from diffusers import SD3ControlNetModel

        base = tiny_pipeline("sd35-4blocks")
        torch.manual_seed(2)
        controlnet = SD3ControlNetModel.from_transformer(base.transformer, num_layers=1,
                                                         num_extra_conditioning_channels=extra_channels)
        return _components(base, cls, controlnet=_randomize_zeros(controlnet))
    return make


def qwenimage_controlnet(cls: str, extra_channels: int = 0):
    def make():
        from diffusers import QwenImageControlNetModel

        base = tiny_pipeline("qwenimage")
        torch.manual_seed(2)
        controlnet = QwenImageControlNetModel.from_transformer(
            base.transformer, num_layers=1, attention_head_dim=16, num_attention_heads=4,
            extra_condition_channels=extra_channels)
        return _components(base, cls, controlnet=_randomize_zeros(controlnet))
    return make


def sana_controlnet():
    from diffusers import SanaControlNetModel

    base = tiny_pipeline("sana")
    torch.manual_seed(2)
    controlnet = SanaControlNetModel(
        patch_size=1, in_channels=4, out_channels=4, num_layers=1, num_attention_heads=4, attention_head_dim=4,
        num_cross_attention_heads=4, cross_attention_head_dim=4, cross_attention_dim=16, caption_channels=8,
        sample_size=32)
    return _components(base, "SanaControlNetPipeline", controlnet=_randomize_zeros(controlnet))


def hunyuandit_controlnet():
    from diffusers import HunyuanDiT2DControlNetModel

    base = tiny_pipeline("hunyuandit-4blocks")
    torch.manual_seed(2)
    c = base.transformer.config  # from_transformer drops the tiny pooled / text sizes: the same config by hand
    controlnet = HunyuanDiT2DControlNetModel(
        conditioning_channels=3, num_attention_heads=c.num_attention_heads, attention_head_dim=c.attention_head_dim,
        in_channels=c.in_channels, patch_size=c.patch_size, sample_size=c.sample_size, hidden_size=c.hidden_size,
        transformer_num_layers=c.num_layers, mlp_ratio=c.mlp_ratio, cross_attention_dim=c.cross_attention_dim,
        cross_attention_dim_t5=c.cross_attention_dim_t5, pooled_projection_dim=c.pooled_projection_dim,
        text_len=c.text_len, text_len_t5=c.text_len_t5)
    return _components(base, "HunyuanDiTControlNetPipeline", controlnet=_randomize_zeros(controlnet))


def pag(build: str, cls: str, layers):
    """A PAG pipeline over the tiny pipeline `build`, perturbing the attention of `layers`."""
    return lambda: _components(tiny_pipeline(build), cls, pag_applied_layers=layers)


def retransformed(build: str, cls: str, parts=None, **config):
    """The tiny pipeline `build` made into diffusers' class `cls`, its transformer rebuilt with `config` changed
    (more input channels where the pipeline concatenates a condition on channels); parts(): other components."""
    def make():
        base = tiny_pipeline(build)
        torch.manual_seed(1)
        transformer = type(base.transformer).from_config(base.transformer.config, **config).eval()
        return _components(base, cls, transformer=transformer, **(parts() if parts else {}))
    return make


def scm_scheduler():
    """SANA-Sprint's consistency scheduler."""
    from diffusers import SCMScheduler

    return dict(scheduler=SCMScheduler())


def video(frames: int, height: int, width: int):
    """A video as diffusers takes one: a list of PIL frames (the sample picture, rolled a little each frame)."""
    from PIL import Image

    first = sample_image(height, width)
    return [Image.fromarray(__import__("numpy").roll(__import__("numpy").asarray(first), 3 * i, axis=1))
            for i in range(frames)]
