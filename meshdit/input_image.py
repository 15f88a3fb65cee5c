"""An input image (generate's --image, serve's `image` field) opened and checked before any rank starts.

The pipeline resizes what it gets (FLUX.1 Kontext: to its training resolution nearest the image's aspect ratio;
image-to-video: to the video's size), so any size within these limits is fine; beyond them the file is refused
from its header, before its pixels are decoded.
"""
from __future__ import annotations

import io
import os
import warnings

from .errors import ConfigError

MAX_IMAGE_SIDE = 8192
"""Pixels along either side at most (as --height / --width)."""
MAX_IMAGE_PIXELS = 4096 * 4096
"""Pixels in all at most (16.8 million: 48 MiB of RGB, which serve sends to every rank)."""
MIN_IMAGE_SIDE = 16
"""Pixels along either side at least: FLUX.1 Kontext cuts its reference to a multiple of 2 x its VAE factor (16
pixels), and diffusers' pipeline divides by zero on a thinner image (a 1 x 1 or 8192 x 1 image)."""
MAX_IMAGE_ASPECT = 100
"""The longer side over the shorter at most: Qwen-Image-Edit resizes its input to about 1024 x 1024 pixels of the
same shape, and its vision encoder refuses a shape beyond 200:1 after that rounding (from about 170:1 on), or
rounds a side to 0 pixels (beyond 4096:1)."""


def open_image(source, name: str = "--image"):
    """source: a path, the file's bytes, or a PIL image -> the RGB PIL image (EXIF orientation applied, as diffusers'
    load_image does). Raises ConfigError naming `name` if it is no image or its size is out of bounds."""
    from PIL import Image, ImageOps

    if isinstance(source, Image.Image):
        image = source
    else:
        if isinstance(source, str) and not os.path.isfile(source):
            raise ConfigError(f"{name} {source!r}: no such file; pass the path of an image file.")
        try:
            with warnings.catch_warnings():  # our own limit is far below PIL's decompression-bomb warning
                warnings.simplefilter("ignore", Image.DecompressionBombWarning)
                image = Image.open(io.BytesIO(source) if isinstance(source, (bytes, bytearray)) else source)
        except (OSError, ValueError, Image.DecompressionBombError) as exc:
            raise ConfigError(f"{name}: not an image file PIL can read ({exc}); pass a PNG, JPEG or WebP.") from None
    check_image_size(image.width, image.height, name)
    try:
        image.load()
        sixteen_bit = image.mode.startswith("I;16") or (image.mode == "I" and image.format == "PNG")
        image = ImageOps.exif_transpose(image)
        return (_to_8_bit(image) if sixteen_bit else image).convert("RGB")
    except (OSError, ValueError, SyntaxError) as exc:  # a truncated or corrupt file fails only when decoded
        raise ConfigError(f"{name}: the image file is damaged ({exc}); pass a complete PNG, JPEG or WebP.") from None


def check_image_size(width: int, height: int, name: str = "--image") -> None:
    if not (MIN_IMAGE_SIDE <= width <= MAX_IMAGE_SIDE and MIN_IMAGE_SIDE <= height <= MAX_IMAGE_SIDE):
        change = "scale it down" if max(width, height) > MAX_IMAGE_SIDE else "pad or scale it up"
        raise ConfigError(f"{name}: the image is {width}x{height} pixels; each side must be "
                          f"{MIN_IMAGE_SIDE}..{MAX_IMAGE_SIDE}: {change} (the pipeline resizes it anyway).")
    if max(width, height) > MAX_IMAGE_ASPECT * min(width, height):
        ratio = max(width, height) / min(width, height)
        raise ConfigError(f"{name}: the image is {width}x{height} pixels, its long side {ratio:.0f} times its short "
                          f"one; at most {MAX_IMAGE_ASPECT}:1 is taken: crop or pad it.")
    if width * height > MAX_IMAGE_PIXELS:
        raise ConfigError(f"{name}: the image is {width}x{height} = {width * height} pixels, more than "
                          f"{MAX_IMAGE_PIXELS} (4096 x 4096): scale it down (the pipeline resizes it anyway).")


def _to_8_bit(image):
    """A 16-bit grayscale image (PIL's I;16 modes; a PNG's "I") scaled to 8 bits (65535 -> 255): PIL's convert("RGB")
    would clip every value above 255 to white."""
    return image.convert("I").point(lambda v: v * (1 / 257)).convert("L")
