"""The pipeline's own `vae.decode` call, made parallel (row bands over the ranks: exact) or tiled.

Every rank runs the same `__call__`, so every rank reaches `pipe.vae.decode(latents, ...)` with the same latents:
the wrapper hands them to meshdit.vae.decode over the group, which gives every rank the whole image, and returns
it as diffusers' decode does (a DecoderOutput, or a tuple with return_dict=False). The wrapper is an attribute on
the VAE instance; removing it leaves the class's own method, untouched.
"""
from __future__ import annotations

import functools
import inspect

from ..vae import decode as mesh_decode
from ..vae.settings import VaeDecodeSettings


class ParallelDecode:
    """`vae.decode` replaced by the mesh decode over `group` until remove()."""

    def __init__(self, vae, settings: VaeDecodeSettings, group) -> None:
        self.vae, self.settings, self.group = vae, settings, group
        original = type(vae).decode  # the class's function (diffusers' apply_forward_hook wraps it)
        names = list(inspect.signature(original).parameters)[1:]  # without self: z, (temb,) return_dict, ...

        @functools.wraps(original)
        def decode(*args, **kwargs):
            named = dict(zip(names, args), **kwargs)
            z = named.pop(names[0])
            return_dict = named.pop("return_dict", True)
            named.pop("generator", None)  # AutoencoderKL's decode takes (and ignores) one
            del vae.__dict__["decode"]  # mesh_decode calls the VAE's own decode inside
            try:
                image = mesh_decode(vae, z, settings, group, **named)
            finally:
                vae.__dict__["decode"] = decode
            if not return_dict:
                return (image,)
            from diffusers.models.autoencoders.vae import DecoderOutput

            return DecoderOutput(sample=image)

        vae.__dict__["decode"] = decode

    def remove(self) -> None:
        self.vae.__dict__.pop("decode", None)
