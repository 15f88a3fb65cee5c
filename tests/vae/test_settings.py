"""Bad VAE decode settings raise ConfigError with a message that names the fix."""
import pytest

from meshdit.errors import ConfigError
from meshdit.vae import VaeDecodeSettings, decode
from meshdit.vae.decoding import upsampling_factor

from .tiny_vaes import build_vae, latents_for


@pytest.mark.parametrize("settings, fix", [
    (VaeDecodeSettings(tile_height=512, tile_overlap=512), "lower the overlap below 512"),
    (VaeDecodeSettings(tile_width=256, tile_overlap=300), "lower the overlap below 256"),
    (VaeDecodeSettings(tile_height=0), "--vae-tile-height 1024"),
    (VaeDecodeSettings(tile_width=-8), "--vae-tile-width 1024"),
    (VaeDecodeSettings(tile_height=512, tile_overlap=-1), "--vae-tile-overlap 64"),
    (VaeDecodeSettings(parallel="yes"), "True or False"),
])
def test_validate_names_the_fix(settings, fix):
    with pytest.raises(ConfigError, match=fix):
        settings.validate()


def test_tiles_must_be_multiples_of_8_before_any_weights_load():
    with pytest.raises(ConfigError, match=r"--vae-tile-width \(1001 px\) must be a multiple of .* 8 .*use 1000 or 1008"):
        VaeDecodeSettings(tile_width=1001).validate()
    with pytest.raises(ConfigError, match="--vae-tile-overlap \\(4 px\\).*use 8"):
        VaeDecodeSettings(tile_height=512, tile_overlap=4).validate()


def test_good_settings_pass():
    VaeDecodeSettings().validate()
    VaeDecodeSettings(parallel=True, tile_height=1024, tile_width=768, tile_overlap=256).validate()
    VaeDecodeSettings(tile_width=512, tile_overlap=0).validate()


def test_tiles_must_be_multiples_of_the_vae_scale():
    vae = build_vae("AutoencoderKL")
    assert upsampling_factor(vae) == 4
    z = latents_for("AutoencoderKL", 1, 8, 8)
    with pytest.raises(ConfigError, match="--vae-tile-height .* multiple of .* 4.*use 16 or 20"):
        decode(vae, z, VaeDecodeSettings(tile_height=18, tile_overlap=8))
    with pytest.raises(ConfigError, match="--vae-tile-overlap .* use 4 or 8"):
        decode(vae, z, VaeDecodeSettings(tile_width=16, tile_overlap=6))


def test_latents_must_be_4d():
    vae = build_vae("AutoencoderKL")
    with pytest.raises(ConfigError, match=r"\[B, C, h, w\]"):
        decode(vae, latents_for("AutoencoderKL", 1, 8, 8)[0])
