"""Parallel VAE decode on VAEs without mid-block attention (the bundled model's VAE among them).

mid_block_add_attention=False leaves an empty ModuleList in the decoder's mid block; the
band split walks past it. Exact as in test_patch_parallel (1e-5 of max|serial|).
"""
import json

import pytest
import torch
import torch.distributed as dist

from meshdit.default_model import weights_path
from meshdit.errors import ConfigError
from meshdit.vae import VaeDecodeSettings, decode
from meshdit.vae.settings import check_vae_config, check_vae_of_model

from .tiny_vaes import build_vae, latents_for

RTOL = 1e-5
BUNDLED_VAE = weights_path() / "vae"


def _bundled_vae():
    from diffusers import AutoencoderKL

    return AutoencoderKL.from_pretrained(str(BUNDLED_VAE)).eval()


def _decodes(parallel: bool):
    """(tiny AutoencoderKL, tiny Flux2, bundled VAE) decodes, each without mid-block attention."""
    vaes = [build_vae(kind, mid_block_add_attention=False) for kind in ("AutoencoderKL", "AutoencoderKLFlux2")]
    latents = [latents_for("AutoencoderKL", 1, 7, 6), latents_for("AutoencoderKLFlux2", 2, 6, 5)]
    vaes.append(_bundled_vae())
    latents.append(torch.randn(1, 4, 32, 32, generator=torch.Generator().manual_seed(3)))  # a 256 px image
    group = dist.group.WORLD if parallel else None
    return [decode(vae, z, VaeDecodeSettings(parallel=parallel), group) for vae, z in zip(vaes, latents)]


def test_parallel_decode_without_mid_attention_equals_serial(run_ranks):
    serial = _decodes(parallel=False)
    assert not any(len(list(v.decoder.mid_block.attentions.children())) for v in [_bundled_vae()])
    for rank, images in enumerate(run_ranks(2, _decodes, True, timeout=120)):
        for which, (image, ref) in enumerate(zip(images, serial)):
            torch.testing.assert_close(image, ref, rtol=0, atol=RTOL * ref.abs().max().item(),
                                       msg=lambda m: f"VAE {which}, rank {rank}: {m}")


def _bundled_config():
    return json.loads((BUNDLED_VAE / "config.json").read_text())


def test_bundled_vae_config_passes_the_preflight_check():
    for settings in (VaeDecodeSettings(parallel=True), VaeDecodeSettings(parallel=True, tile_height=128)):
        check_vae_config(_bundled_config(), settings, 256, 256)
    check_vae_of_model(str(weights_path()), VaeDecodeSettings(parallel=True), 256, 256)


@pytest.mark.parametrize("change, settings, fix", [
    ({"_class_name": "AutoencoderTiny"}, VaeDecodeSettings(parallel=True), "AutoencoderTiny.*run without"),
    ({"up_block_types": ["UpDecoderBlock2D", "AttnUpDecoderBlock2D"] * 2}, VaeDecodeSettings(parallel=True),
     "AttnUpDecoderBlock2D.*run without --use-parallel-vae"),
    ({"act_fn": "softmax"}, VaeDecodeSettings(parallel=True), "activation 'softmax'"),
    # 5 up blocks: 16x upsampling, so 8-pixel multiples no longer cut whole latent rows
    ({"up_block_types": ["UpDecoderBlock2D"] * 5}, VaeDecodeSettings(tile_height=136), "factor 16.*use 128 or 144"),
    ({"up_block_types": ["UpDecoderBlock2D"] * 5}, VaeDecodeSettings(parallel=True), "--height 200 .*factor 16"),
])
def test_preflight_refuses_what_the_decode_cannot_do(change, settings, fix):
    with pytest.raises(ConfigError, match=fix):
        check_vae_config({**_bundled_config(), **change}, settings, 200, 256)


def test_plain_decode_needs_no_vae_check():
    check_vae_config({"_class_name": "AutoencoderTiny"}, VaeDecodeSettings(), 200, 256)
