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
    if not (1 <= width <= MAX_IMAGE_SIDE and 1 <= height <= MAX_IMAGE_SIDE):
        raise ConfigError(f"{name}: the image is {width}x{height} pixels; each side must be 1..{MAX_IMAGE_SIDE}: "
                          "scale it down (the pipeline resizes it anyway).")
    if width * height > MAX_IMAGE_PIXELS:
        raise ConfigError(f"{name}: the image is {width}x{height} = {width * height} pixels, more than "
                          f"{MAX_IMAGE_PIXELS} (4096 x 4096): scale it down (the pipeline resizes it anyway).")


def _to_8_bit(image):
    """A 16-bit grayscale image (PIL's I;16 modes; a PNG's "I") scaled to 8 bits (65535 -> 255): PIL's convert("RGB")
    would clip every value above 255 to white."""
    return image.convert("I").point(lambda v: v * (1 / 257)).convert("L")
