"""Writing generated images where the user asked: .png (or any PIL format) or .npy."""
from __future__ import annotations

import os

import numpy as np

from .errors import ConfigError


def check_output_path(pattern: str, count: int) -> None:
    """Fails early (before ranks start) on a path that cannot hold `count` images."""
    if count > 1 and "{i}" not in pattern:
        raise ConfigError(f"{count} images will be generated but --output {pattern!r} has no {{i}}: use e.g. "
                          f"'out-{{i}}.png', where {{i}} becomes the image's index in prompt order.")
    ext = os.path.splitext(pattern)[1].lower()
    if ext not in (".png", ".jpg", ".jpeg", ".webp", ".bmp", ".npy"):
        raise ConfigError(f"--output {pattern!r}: use a .png, .jpg, .webp or .npy file name.")


def save_images(images: np.ndarray, pattern: str, start_index: int = 0) -> list[str]:
    """images: [N, H, W, 3] float in [0, 1]. Returns the paths written."""
    from PIL import Image

    paths = []
    for offset, image in enumerate(images):
        path = pattern.replace("{i}", str(start_index + offset))
        os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
        if path.lower().endswith(".npy"):
            np.save(path, np.asarray(image, dtype=np.float32))
        else:
            Image.fromarray((np.clip(image, 0, 1) * 255).round().astype(np.uint8)).save(path)
        paths.append(path)
    return paths
