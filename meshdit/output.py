"""Writing generated images where the user asked: .png (or any PIL format) or .npy; videos as .mp4 (H.264),
animated .gif / .webp, or .npy.

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
VIDEO_EXTENSIONS = (".mp4", ".gif", ".webp", ".npy")

# What a user can do about the usual write failures.
_CAUSES = {errno.ENOSPC: "disk full", errno.EDQUOT: "disk quota exceeded",
           errno.EFBIG: "file size limit exceeded (ulimit -f)", errno.EROFS: "read-only file system",
           errno.EACCES: "permission denied"}


class OutputWriteError(OSError):
    """An image could not be written; the message names the cause and says what was kept."""

    says_it_all = True  # the launcher prints the message alone, without the rank's traceback

    def __str__(self) -> str:  # the message alone, without OSError's "[Errno 28]" prefix
        return self.strerror or super().__str__()


# Room a write needs beyond what a short write reports; below it a file system counts as full.
_FULL_BELOW_BYTES = 1 << 20


def _write_errno(exc: OSError, folder: str) -> int | None:
    """The errno of a failed write. Some writers report a full disk without one (numpy's save: "N requested
    and M written"): then a file system left with (almost) no free space says ENOSPC."""
    if exc.errno is not None:
        return exc.errno
    try:
        stat = os.statvfs(folder)
    except OSError:
        return None
    return errno.ENOSPC if stat.f_bavail * stat.f_frsize < _FULL_BELOW_BYTES else None


def check_output_path(pattern: str, count: int, video: bool = False) -> None:
    """Fails early (before ranks start) on a path that cannot hold `count` images (videos, with `video`)."""
    what, example = ("videos", "clip") if video else ("images", "out")
    ext = os.path.splitext(pattern)[1].lower()
    if count > 1 and "{i}" not in pattern:
        raise ConfigError(f"{count} {what} will be generated but --output {pattern!r} has no {{i}}: use e.g. "
                          f"'{example}-{{i}}{ext or '.png'}', where {{i}} becomes the index in prompt order.")
    if video and ext not in VIDEO_EXTENSIONS:
        raise ConfigError(f"--output {pattern!r}: this model makes videos; use a .mp4 (H.264), .gif or .webp "
                          "(animated) or .npy (float32 frames) file name.")
    if not video and ext not in EXTENSIONS:
        hint = " (.mp4 and .gif are for video models)" if ext in VIDEO_EXTENSIONS else ""
        raise ConfigError(f"--output {pattern!r}: use a .png, .jpg, .webp or .npy file name{hint}.")
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


def _write_atomic(path: str, write, to_path: bool = False) -> None:
    """write(file object) into a temp file beside `path`, then rename it to `path`.
    to_path: write(temp path) instead, for writers that open the file themselves (ffmpeg); the temp name
    ends in the target's extension, from which they take the format."""
    folder = os.path.dirname(os.path.abspath(path))
    os.makedirs(folder, exist_ok=True)
    suffix = ".partial" + (os.path.splitext(path)[1] if to_path else "")
    fd, tmp = tempfile.mkstemp(prefix=f".{os.path.basename(path)}.", suffix=suffix, dir=folder)
    try:
        os.fchmod(fd, 0o666 & ~_umask())   # as an ordinary new file (mkstemp makes 0600)
        if to_path:
            os.close(fd)
            write(tmp)
            with open(tmp, "rb") as f:
                os.fsync(f.fileno())
        else:
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
            code = _write_errno(exc, folder)
            cause = _CAUSES.get(code, exc.strerror or str(exc))
            detail = f"{errno.errorcode[code]}: {os.strerror(code)}" if code in errno.errorcode else str(exc)
            if code is not None and exc.errno is None:
                detail += f"; the writer said: {exc}"
            kept = f"the earlier {path} is unchanged" if os.path.exists(path) else f"{path} was not created"
            fix = f"; free space on the file system of {folder}, or choose another --output" \
                if code in (errno.ENOSPC, errno.EDQUOT) else ""
            raise OutputWriteError(code, f"cannot write {path}: {cause} ({detail}); {kept}{fix}") from None
        raise


class NonFiniteOutputError(ValueError):
    """The generated images hold NaN or infinite values; nothing was written."""

    says_it_all = True


def non_finite_note(images) -> str | None:
    """Why images ([N, H, W, 3] or videos [N, F, H, W, 3], arrays) holding NaN or inf are no result, else None."""
    import numpy as np

    bad = sum(int((~np.isfinite(np.asarray(image, dtype=np.float32))).sum()) for image in images)
    if not bad:
        return None
    total = sum(np.asarray(image).size for image in images)
    return (f"the generated image holds NaN or infinite values ({bad} of {total} values): likely a LoRA adapter "
            "weight far from 1 or a damaged adapter file, a --guidance-scale far outside the model's range, or "
            "float16 overflow (try --dtype bfloat16)")


def check_finite(images, pattern: str) -> None:
    """Raises NonFiniteOutputError before anything is written: an earlier file at the path stays as it was."""
    note = non_finite_note(images)
    if note:
        first = pattern.replace("{i}", "0")
        kept = f"the earlier {first} is unchanged" if os.path.exists(first) else f"{first} was not created"
        raise NonFiniteOutputError(f"{note}; nothing was written ({kept}).")


def save_images(images, pattern: str, start_index: int = 0) -> list[str]:
    """images: [N, H, W, 3] float in [0, 1]. Returns the paths written (exactly as named). Images holding NaN or
    inf are refused before any is written (NonFiniteOutputError)."""
    import numpy as np  # here, not at the top: a refused command is checked before numpy loads
    from PIL import Image

    check_finite(images, pattern)
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


def save_videos(videos, pattern: str, fps: int, start_index: int = 0) -> list[str]:
    """videos: [N, F, H, W, 3] float in [0, 1]. .mp4: H.264 (yuv420p, as players expect); .gif / .webp:
    animated, looping; .npy: the float32 frames (F, H, W, 3). Returns the paths written. Videos holding NaN or inf
    are refused before any is written (NonFiniteOutputError)."""
    import numpy as np  # here, not at the top: a refused command is checked before numpy loads
    from PIL import Image

    check_finite(videos, pattern)
    paths = []
    for offset, video in enumerate(videos):
        path = pattern.replace("{i}", str(start_index + offset))
        ext = os.path.splitext(path)[1].lower()
        if ext == ".npy":
            array = np.asarray(video, dtype=np.float32)  # [F, H, W, 3]
            _write_atomic(path, lambda f: np.save(f, array))
            paths.append(path)
            continue
        frames = (np.clip(video, 0, 1) * 255).round().astype(np.uint8)  # [F, H, W, 3]
        if ext == ".mp4":
            _write_atomic(path, lambda tmp: _write_mp4(tmp, frames, fps), to_path=True)
        else:
            pils = [Image.fromarray(frame) for frame in frames]
            fmt = Image.registered_extensions()[ext]
            _write_atomic(path, lambda f: pils[0].save(f, format=fmt, save_all=True, append_images=pils[1:],
                                                       duration=round(1000 / fps), loop=0))
        paths.append(path)
    return paths


def video_file_bytes(video, fps: int, ext: str = ".mp4") -> bytes:
    """One video [F, H, W, 3] float in [0, 1] as the bytes of the file save_videos writes for it (the same
    encoder and settings: `meshdit serve` answers with what `meshdit generate --output clip.mp4` writes).
    ffmpeg writes to a path, so the file passes through a temporary folder, removed at once."""
    with tempfile.TemporaryDirectory(prefix="meshdit-video-") as folder:
        path = os.path.join(folder, "video" + ext)
        save_videos([video], path, fps)
        with open(path, "rb") as f:
            return f.read()


def _write_mp4(path: str, frames, fps: int) -> None:
    import imageio.v2 as imageio

    # macro_block_size 2: yuv420p needs even sides; the default (16) would rescale other sizes
    with imageio.get_writer(path, format="FFMPEG", mode="I", fps=fps, codec="libx264", pixelformat="yuv420p",
                            macro_block_size=2) as writer:
        for frame in frames:
            writer.append_data(frame)
