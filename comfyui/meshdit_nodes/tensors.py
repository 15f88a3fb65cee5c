"""ComfyUI's tensors <-> the files the server reads and writes.

IMAGE: float32 [B, H, W, C] in 0..1, C = 3 (RGB). MASK: float32 [B, H, W] (or [H, W]) in 0..1, 1 where the
image is to change (LoadImage's mask is 1 - alpha). AUDIO: {"waveform": [B, channels, samples], "sample_rate"}."""
from __future__ import annotations

import io

import numpy as np
import torch
from PIL import Image


def png_to_image(data: bytes) -> torch.Tensor:
    """A PNG file -> [1, H, W, 3] float32 in 0..1 (value / 255, as ComfyUI's LoadImage)."""
    pixels = np.asarray(Image.open(io.BytesIO(data)).convert("RGB"), dtype=np.float32) / 255.0  # [H, W, 3]
    return torch.from_numpy(pixels)[None]


def image_to_png(image: torch.Tensor) -> bytes:
    """One [H, W, C] image (C 3 or 4, 0..1) -> PNG bytes, rounded to the nearest 8-bit value, so an image that
    came from a PNG (LoadImage: value / 255) is sent as the same pixels."""
    pixels = np.round(np.clip(255.0 * image.detach().cpu().float().numpy(), 0, 255)).astype(np.uint8)  # [H, W, C]
    if pixels.shape[-1] == 1:
        pixels = pixels[..., 0]
    buffer = io.BytesIO()
    Image.fromarray(pixels).save(buffer, format="PNG")
    return buffer.getvalue()


def mask_to_png(mask: torch.Tensor) -> bytes:
    """One [H, W] mask (1: change) -> an RGBA PNG whose transparent pixels are the ones to change, OpenAI's
    edit-mask convention."""
    alpha = np.clip(255.0 * (1.0 - mask.detach().cpu().float().numpy()), 0, 255).astype(np.uint8)  # [H, W]
    rgba = np.zeros((*alpha.shape, 4), dtype=np.uint8)
    rgba[..., 3] = alpha
    buffer = io.BytesIO()
    Image.fromarray(rgba, "RGBA").save(buffer, format="PNG")
    return buffer.getvalue()


def batch(images) -> torch.Tensor:
    """[1, H, W, 3] images -> [B, H, W, 3]; they must share a size (a server's images do)."""
    return torch.cat(list(images), dim=0)


def mp4_frames(path: str) -> tuple[torch.Tensor, float, dict | None]:
    """(frames [F, H, W, 3] float32 0..1, frames per second, AUDIO or None) of a video file, read with PyAV
    (a ComfyUI requirement) where it is installed, else with imageio's ffmpeg reader."""
    try:
        import av
    except ImportError:
        return _frames_imageio(path) + (None,)
    with av.open(path) as container:
        stream = container.streams.video[0]
        fps = float(stream.average_rate or stream.guessed_rate or 0)
        frames = [frame.to_ndarray(format="rgb24") for frame in container.decode(stream)]  # each [H, W, 3]
    return _stack(frames), fps, _audio_av(path)


def _audio_av(path: str) -> dict | None:
    """The file's first audio stream as ComfyUI's AUDIO, or None (meshdit's video models make no sound)."""
    import av

    with av.open(path) as container:
        if not container.streams.audio:
            return None
        stream = container.streams.audio[0]
        chunks = [frame.to_ndarray().reshape(stream.channels, -1) for frame in container.decode(stream)]
        if not chunks:
            return None
        samples = np.concatenate(chunks, axis=1).astype(np.float32)  # [channels, samples]
        return {"waveform": torch.from_numpy(samples)[None], "sample_rate": int(stream.rate)}


def _frames_imageio(path: str) -> tuple[torch.Tensor, float]:
    try:
        import imageio.v2 as imageio
    except ImportError:
        raise RuntimeError("reading the MP4 needs PyAV (pip install av; ComfyUI's requirements include it) or "
                           "imageio with imageio-ffmpeg") from None
    reader = imageio.get_reader(path, format="FFMPEG")
    try:
        fps = float(reader.get_meta_data().get("fps", 0))
        frames = [np.asarray(frame)[..., :3] for frame in reader]  # each [H, W, 3] uint8
    finally:
        reader.close()
    return _stack(frames), fps


def _stack(frames: list) -> torch.Tensor:
    if not frames:
        raise RuntimeError("the server's MP4 has no frames")
    return torch.from_numpy(np.stack(frames).astype(np.float32) / 255.0)  # [F, H, W, 3]
