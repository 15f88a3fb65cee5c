"""How the VAE decode is shared out: patch-parallel bands, tiles, or both."""
from __future__ import annotations

from dataclasses import dataclass

from ..errors import ConfigError


@dataclass
class VaeDecodeSettings:
    """Settings of meshdit.vae.decode (CLI flags in comments).

    Tiling is on when tile_height or tile_width is set; an unset one means no
    tiling along that axis (the tile spans the whole image that way).
    """

    parallel: bool = False
    """--use-parallel-vae: split the latent into row bands over the ranks (exact)."""
    tile_height: int | None = None
    """--vae-tile-height: tile height in pixels of the output image."""
    tile_width: int | None = None
    """--vae-tile-width: tile width in pixels of the output image."""
    tile_overlap: int = 64
    """--vae-tile-overlap: pixels neighbouring tiles share; linear cross-fade over them."""

    @property
    def tiled(self) -> bool:
        return self.tile_height is not None or self.tile_width is not None

    def validate(self, scale: int = 8) -> None:
        """Raises ConfigError naming the fix. `scale`: the VAE's upsampling factor; 8 for every
        supported pipeline's VAE (FLUX.1, FLUX.2, SD3.5, PixArt), so the CLI can check tile
        sizes before any weights load; decode() checks again against the VAE it is given."""
        if not isinstance(self.parallel, bool):
            raise ConfigError(f"VAE parallel must be True or False, got {self.parallel!r}.")
        for name, flag in (("tile_height", "--vae-tile-height"), ("tile_width", "--vae-tile-width")):
            value = getattr(self, name)
            if value is None:
                continue
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ConfigError(f"{flag} must be a whole number of pixels >= 1, got {value!r}; e.g. {flag} 1024.")
        overlap = self.tile_overlap
        if not isinstance(overlap, int) or isinstance(overlap, bool) or overlap < 0:
            raise ConfigError(
                f"--vae-tile-overlap must be a whole number of pixels >= 0, got {overlap!r}; e.g. --vae-tile-overlap 64."
            )
        for name, flag in (("tile_height", "--vae-tile-height"), ("tile_width", "--vae-tile-width")):
            value = getattr(self, name)
            if value is not None and overlap >= value:
                raise ConfigError(
                    f"--vae-tile-overlap ({overlap} px) must be smaller than {flag} ({value} px): "
                    f"lower the overlap below {value} (a quarter of the tile, {value // 4} px, is usual) "
                    f"or raise {flag} above {overlap}."
                )
        if not self.tiled:
            return
        for name, flag in (("tile_height", "--vae-tile-height"), ("tile_width", "--vae-tile-width"),
                           ("tile_overlap", "--vae-tile-overlap")):
            value = getattr(self, name)
            if value is not None and value % scale:
                lower, upper = value // scale * scale, (value // scale + 1) * scale
                hint = f"{lower} or {upper}" if lower > 0 else f"{upper}"
                raise ConfigError(
                    f"{flag} ({value} px) must be a multiple of the VAE's upsampling factor {scale} "
                    f"(tiles are cut from the latent); use {hint}."
                )


# What the band split (patch_parallel.BandHooks) and the tiles (tiled.py) are known to handle.
KNOWN_VAE_CLASSES = ("AutoencoderKL", "AutoencoderKLFlux2")
KNOWN_UP_BLOCKS = ("UpDecoderBlock2D",)
KNOWN_ACTIVATIONS = ("silu", "swish", "relu", "gelu", "mish")


def check_vae_config(vae_config: dict, settings: VaeDecodeSettings, height: int, width: int) -> None:
    """Checks, from the VAE's config.json alone (no weights, before ranks start), that `settings`
    can decode a height x width image with this VAE. Raises ConfigError naming the fix.

    A plain decode (neither parallel nor tiled) runs diffusers' own vae.decode: nothing to check.
    """
    if not (settings.parallel or settings.tiled):
        return
    what = "--use-parallel-vae" if settings.parallel else "--vae-tile-height/--vae-tile-width"
    plain = "run without --use-parallel-vae and the --vae-tile-* flags (diffusers' own decode)"
    cls = vae_config.get("_class_name")
    if cls not in KNOWN_VAE_CLASSES:
        raise ConfigError(f"{what} supports the VAE classes {', '.join(KNOWN_VAE_CLASSES)}; this model's VAE is "
                          f"{cls!r} (vae/config.json): {plain}.")
    up_blocks = list(vae_config.get("up_block_types") or ["UpDecoderBlock2D"] * 4)
    unknown = sorted(set(up_blocks) - set(KNOWN_UP_BLOCKS))
    if settings.parallel and unknown:
        raise ConfigError(f"--use-parallel-vae does not know the decoder block type(s) {unknown} of this VAE "
                          f"(vae/config.json up_block_types); {plain}.")
    act = str(vae_config.get("act_fn", "silu"))
    if settings.parallel and act not in KNOWN_ACTIVATIONS:
        raise ConfigError(f"--use-parallel-vae does not know the VAE activation {act!r} (vae/config.json act_fn); "
                          f"{plain}.")
    scale = 2 ** (len(up_blocks) - 1)   # one nearest-2x upsampler after every up block but the last
    settings.validate(scale)
    for name, value in (("--height", height), ("--width", width)):
        if value % scale:
            raise ConfigError(f"{name} {value} is not a multiple of the VAE's upsampling factor {scale}: "
                              f"use {max(scale, value // scale * scale)} or {(value // scale + 1) * scale}.")


def check_vae_of_model(model: str, settings: VaeDecodeSettings, height: int, width: int) -> None:
    """check_vae_config on the VAE config of a pipeline folder or Hub id (read without torch)."""
    if not (settings.parallel or settings.tiled):
        return
    from ..models.info import _read_json

    check_vae_config(_read_json(model, "vae/config.json"), settings, height, width)
