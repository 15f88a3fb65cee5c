"""Writing generated images where the user asked: .png (or any PIL format) or .npy.

Each file is written to a temporary file in the same folder and renamed over the
target, so a failed write (disk full, quota, a killed run) never leaves a truncated
image nor destroys an earlier one at that path.
"""
from __future__ import annotations

import errno
import os
import tempfile

from .errors import ConfigError

EXTENSIONS = (".png", ".jpg", ".jpeg", ".webp", ".bmp", ".npy")

# What a user can do about the usual write failures.
_CAUSES = {errno.ENOSPC: "disk full", errno.EDQUOT: "disk quota exceeded",
           errno.EFBIG: "file size limit exceeded (ulimit -f)", errno.EROFS: "read-only file system",
           errno.EACCES: "permission denied"}


class OutputWriteError(OSError):
    """An image could not be written; the message names the cause and says what was kept."""


def check_output_path(pattern: str, count: int) -> None:
    """Fails early (before ranks start) on a path that cannot hold `count` images."""
    if count > 1 and "{i}" not in pattern:
        raise ConfigError(f"{count} images will be generated but --output {pattern!r} has no {{i}}: use e.g. "
                          f"'out-{{i}}.png', where {{i}} becomes the image's index in prompt order.")
    ext = os.path.splitext(pattern)[1].lower()
    if ext not in EXTENSIONS:
        raise ConfigError(f"--output {pattern!r}: use a .png, .jpg, .webp or .npy file name.")
    path = os.path.abspath(pattern.replace("{i}", "0"))
    if os.path.isdir(path):
        raise ConfigError(f"--output {pattern!r} is a directory: name a file in it, e.g. {os.path.join(pattern, 'out.png')!r}.")
    folder = os.path.dirname(path)
    existing = folder
    while not os.path.exists(existing):   # the folder is made on save: check its first existing ancestor
        existing = os.path.dirname(existing)
    if not os.path.isdir(existing):
        raise ConfigError(f"--output {pattern!r}: {existing} is a file, not a folder; choose another path.")
    if not os.access(existing, os.W_OK | os.X_OK):
        raise ConfigError(f"--output {pattern!r}: cannot write in {existing} (read-only or no permission); "
                          "choose a writable folder.")


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def _write_atomic(path: str, write) -> None:
    """write(file object) into a temp file beside `path`, then rename it to `path`."""
    folder = os.path.dirname(os.path.abspath(path))
    os.makedirs(folder, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{os.path.basename(path)}.", suffix=".partial", dir=folder)
    try:
        os.fchmod(fd, 0o666 & ~_umask())   # as an ordinary new file (mkstemp makes 0600)
        with os.fdopen(fd, "wb") as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException as exc:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        if isinstance(exc, OSError) and not isinstance(exc, OutputWriteError):
            cause = _CAUSES.get(exc.errno, exc.strerror or str(exc))
            kept = f"the earlier {path} is unchanged" if os.path.exists(path) else f"{path} was not created"
            raise OutputWriteError(exc.errno, f"cannot write {path}: {cause} ({exc.strerror or exc}); {kept}") from None
        raise


def save_images(images, pattern: str, start_index: int = 0) -> list[str]:
    """images: [N, H, W, 3] float in [0, 1]. Returns the paths written (exactly as named)."""
    import numpy as np  # here, not at the top: a refused command is checked before numpy loads
    from PIL import Image

    paths = []
    for offset, image in enumerate(images):
        path = pattern.replace("{i}", str(start_index + offset))
        ext = os.path.splitext(path)[1].lower()
        if ext == ".npy":
            array = np.asarray(image, dtype=np.float32)      # [H, W, 3]
            _write_atomic(path, lambda f: np.save(f, array))  # a file object: np.save adds no ".npy"
        else:
            pil = Image.fromarray((np.clip(image, 0, 1) * 255).round().astype(np.uint8))
            fmt = Image.registered_extensions()[ext]
            _write_atomic(path, lambda f: pil.save(f, format=fmt))
        paths.append(path)
    return paths
