"""How the VAE decode is shared out: patch-parallel bands, tiles, or both."""
from __future__ import annotations

from dataclasses import dataclass

from ..config_files import read_json
from ..errors import ConfigError
from ..flag_spec import flag_text, flagged


@dataclass
class VaeDecodeSettings:
    """Settings of meshdit.vae.decode; each field carries its `meshdit generate` flag.

    Tiling is on when tile_height or tile_width is set; an unset one means no
    tiling along that axis (the tile spans the whole image that way).
    """

    parallel: bool = flagged(
        False, flag="use-parallel-vae", action="store_true",
        help="decode in row bands over the ranks; exact (default: off, rank 0 decodes alone)")
    tile_height: int | None = flagged(
        None, flag="vae-tile-height", type=int, metavar="PX",
        help="tiled decode: tile height in output pixels (default: no tiling)")
    tile_width: int | None = flagged(
        None, flag="vae-tile-width", type=int, metavar="PX",
        help="tiled decode: tile width in output pixels (default: no tiling)")
    tile_overlap: int = flagged(
        64, flag="vae-tile-overlap", type=int, metavar="PX",
        help="tiled decode: pixels neighbouring tiles share, cross-faded linearly (default: 64)")
    tile_frames: int | None = flagged(
        None, flag="vae-tile-frames", type=int, metavar="N",
        help="video VAEs with temporal tiling (HunyuanVideo, LTX): output frames per temporal tile; "
             "neighbours share one latent frame (default: the VAE's own)")

    @property
    def tiled(self) -> bool:
        return self.tile_height is not None or self.tile_width is not None or self.tile_frames is not None

    def validate(self, scale: int = 8) -> None:
        """Raises ConfigError naming the fix. `scale`: the VAE's upsampling factor; 8 for every
        supported pipeline's VAE (FLUX.1, FLUX.2, SD3.5, PixArt), so the CLI can check tile
        sizes before any weights load; decode() checks again against the VAE it is given."""
        if not isinstance(self.parallel, bool):
            raise ConfigError(f"VAE parallel must be True or False, got {self.parallel!r}.")
        for name in ("tile_height", "tile_width", "tile_frames"):
            value, flag = getattr(self, name), flag_text(VaeDecodeSettings, name)
            if value is None:
                continue
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ConfigError(f"{flag} must be a whole number of pixels >= 1, got {value!r}; e.g. {flag} 1024.")
        overlap, overlap_flag = self.tile_overlap, flag_text(VaeDecodeSettings, "tile_overlap")
        if not isinstance(overlap, int) or isinstance(overlap, bool) or overlap < 0:
            raise ConfigError(
                f"{overlap_flag} must be a whole number of pixels >= 0, got {overlap!r}; e.g. {overlap_flag} 64."
            )
        for name in ("tile_height", "tile_width"):
            value, flag = getattr(self, name), flag_text(VaeDecodeSettings, name)
            if value is not None and overlap >= value:
                raise ConfigError(
                    f"{overlap_flag} ({overlap} px) must be smaller than {flag} ({value} px): "
                    f"lower the overlap below {value} (a quarter of the tile, {value // 4} px, is usual) "
                    f"or raise {flag} above {overlap}."
                )
        if not self.tiled:
            return
        for name in ("tile_height", "tile_width", "tile_overlap"):
            value, flag = getattr(self, name), flag_text(VaeDecodeSettings, name)
            if value is not None and value % scale:
                lower, upper = value // scale * scale, (value // scale + 1) * scale
                hint = f"{lower} or {upper}" if lower > 0 else f"{upper}"
                raise ConfigError(
                    f"{flag} ({value} px) must be a multiple of the VAE's upsampling factor {scale} "
                    f"(tiles are cut from the latent); use {hint}."
                )


# What the band split (patch_parallel.BandHooks) and the tiles (tiled.py) are known to handle.
IMAGE_VAE_CLASSES = ("AutoencoderKL", "AutoencoderKLFlux2")
# The causal 3-D video VAEs (video_modules.py: band split; video_tiling.py: their own tiling).
VIDEO_VAE_CLASSES = ("AutoencoderKLWan", "AutoencoderKLCogVideoX", "AutoencoderKLHunyuanVideo",
                     "AutoencoderKLHunyuanVideo15", "AutoencoderKLLTXVideo", "AutoencoderKLQwenImage")
KNOWN_VAE_CLASSES = IMAGE_VAE_CLASSES + VIDEO_VAE_CLASSES
# VAEs of supported pipelines that the band split and tiles cannot decode exactly yet, and why.
UNSPLIT_VAE_REASONS = {
    "AutoencoderDC": "SANA's DC-AE decoder attends over the whole image with multi-scale linear attention (its "
                     "K.V summary over every pixel) and upsamples by pixel shuffle, which meshdit's band split does "
                     "not cover",
}
KNOWN_UP_BLOCKS = ("UpDecoderBlock2D",)
KNOWN_ACTIVATIONS = ("silu", "swish", "relu", "gelu", "mish")


def check_vae_config(vae_config: dict, settings: VaeDecodeSettings, height: int, width: int) -> None:
    """Checks, from the VAE's config.json alone (no weights, before ranks start), that `settings`
    can decode a height x width image with this VAE. Raises ConfigError naming the fix.

    A plain decode (neither parallel nor tiled) runs diffusers' own vae.decode: nothing to check.
    """
    scale = check_vae_class(vae_config, settings)
    if scale is None:
        return
    for name, value in (("--height", height), ("--width", width)):
        if value % scale:
            raise ConfigError(f"{name} {value} is not a multiple of the VAE's upsampling factor {scale}: "
                              f"use {max(scale, value // scale * scale)} or {(value // scale + 1) * scale}.")


def check_vae_class(vae_config: dict, settings: VaeDecodeSettings) -> int | None:
    """The size-free part of check_vae_config (the CLI's, and the Python API's Engine before any decode): the VAE's
    class and `settings` against it. Returns the VAE's upsampling factor (None: a plain decode, nothing checked)."""
    if not (settings.parallel or settings.tiled):
        return None
    what = "--use-parallel-vae" if settings.parallel else "--vae-tile-height/--vae-tile-width"
    plain = "run without --use-parallel-vae and the --vae-tile-* flags (diffusers' own decode)"
    cls = vae_config.get("_class_name")
    if cls in UNSPLIT_VAE_REASONS:
        raise ConfigError(f"{what} cannot decode this model's {cls} exactly: {UNSPLIT_VAE_REASONS[cls]}; {plain}.")
    if cls not in KNOWN_VAE_CLASSES:
        raise ConfigError(f"{what} supports the VAE classes {', '.join(KNOWN_VAE_CLASSES)}; this model's VAE is "
                          f"{cls!r} (vae/config.json): {plain}.")
    if settings.tile_frames is not None and cls not in ("AutoencoderKLHunyuanVideo", "AutoencoderKLLTXVideo"):
        flag = flag_text(VaeDecodeSettings, "tile_frames")
        raise ConfigError(f"{flag}: the VAE {cls} has no temporal tiling (HunyuanVideo and LTX have); drop {flag}.")
    if cls in VIDEO_VAE_CLASSES:
        scale = video_spatial_scale(vae_config)
        _check_video_settings(cls, vae_config, settings, plain)
    else:
        scale = _image_checks(vae_config, settings, plain)
    settings.validate(scale)
    return scale


def video_spatial_scale(vae_config: dict) -> int:
    """Output pixels per latent pixel of a video VAE, from its config.json (diffusers' defaults where unset)."""
    cls = vae_config.get("_class_name")
    if cls == "AutoencoderKLWan":
        return int(vae_config.get("scale_factor_spatial", 8))
    if cls == "AutoencoderKLQwenImage":   # Wan's VAE under Qwen-Image's names: 2x per downsampling
        return 2 ** len(vae_config.get("temperal_downsample", (False, True, True)))
    if cls == "AutoencoderKLHunyuanVideo":
        return int(vae_config.get("spatial_compression_ratio", 8))
    if cls == "AutoencoderKLHunyuanVideo15":
        return int(vae_config.get("spatial_compression_ratio", 16))
    if cls == "AutoencoderKLLTXVideo":
        return int(vae_config.get("spatial_compression_ratio") or vae_config.get("patch_size", 4) * 2 ** sum(
            vae_config.get("spatio_temporal_scaling", _LTX_SCALING)))
    return 2 ** (len(vae_config.get("block_out_channels", (128, 256, 256, 512))) - 1)   # CogVideoX


_LTX_SCALING = (True, True, True, False)   # AutoencoderKLLTXVideo's default spatio_temporal_scaling


def video_temporal_scale(vae_config: dict, key: str) -> int:
    """Frames per latent frame (after the first) of a video VAE: its config's `key`, or, where LTX leaves it
    null (diffusers computes it), patch_size_t x 2 ** (the blocks that scale time)."""
    value = vae_config.get(key)
    if value is None and vae_config.get("_class_name") == "AutoencoderKLLTXVideo":
        value = vae_config.get("patch_size_t", 1) * 2 ** sum(vae_config.get("spatio_temporal_scaling", _LTX_SCALING))
    return int(value or 1)


def _check_video_settings(cls: str, vae_config: dict, settings: VaeDecodeSettings, plain: str) -> None:
    if settings.parallel and settings.tiled:
        raise ConfigError(f"{cls}: a video VAE decodes either in bands over the ranks (--use-parallel-vae) or in "
                          "its own tiles (--vae-tile-*), not both; drop one of them.")
    if cls == "AutoencoderKLHunyuanVideo15" and settings.tiled and settings.tile_height != settings.tile_width:
        raise ConfigError("AutoencoderKLHunyuanVideo15 tiles with square tiles (one overlap factor): set "
                          "--vae-tile-height and --vae-tile-width to the same size.")
    if settings.parallel and cls == "AutoencoderKLLTXVideo" and any(vae_config.get("decoder_inject_noise") or ()):
        raise ConfigError("--use-parallel-vae: this LTX VAE injects random noise while decoding "
                          f"(vae/config.json decoder_inject_noise), which no split can reproduce; {plain}.")


def _image_checks(vae_config: dict, settings: VaeDecodeSettings, plain: str) -> int:
    """The image VAE's checks; returns its upsampling factor."""
    up_blocks = list(vae_config.get("up_block_types") or ["UpDecoderBlock2D"] * 4)
    unknown = sorted(set(up_blocks) - set(KNOWN_UP_BLOCKS))
    if settings.parallel and unknown:
        raise ConfigError(f"--use-parallel-vae does not know the decoder block type(s) {unknown} of this VAE "
                          f"(vae/config.json up_block_types); {plain}.")
    act = str(vae_config.get("act_fn", "silu"))
    if settings.parallel and act not in KNOWN_ACTIVATIONS:
        raise ConfigError(f"--use-parallel-vae does not know the VAE activation {act!r} (vae/config.json act_fn); "
                          f"{plain}.")
    return 2 ** (len(up_blocks) - 1)   # one nearest-2x upsampler after every up block but the last


def check_vae_of_model(model: str, settings: VaeDecodeSettings, height: int, width: int) -> None:
    """check_vae_config on the VAE config of a pipeline folder or Hub id (read without torch)."""
    if not (settings.parallel or settings.tiled):
        return
    check_vae_config(read_json(model, "vae/config.json"), settings, height, width)
