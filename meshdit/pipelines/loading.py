"""Loading a diffusers pipeline from a folder or a Hub id."""
from __future__ import annotations

import torch

from ..errors import ConfigError


def default_dtype(device: torch.device) -> torch.dtype:
    """bf16 on GPUs, fp32 on CPU (CPU bf16 matmuls are slow and less exact)."""
    return torch.bfloat16 if device.type == "cuda" else torch.float32


def load_pipeline(model: str, device: torch.device, torch_dtype: torch.dtype | None = None):
    from diffusers import DiffusionPipeline

    dtype = torch_dtype or default_dtype(device)
    try:
        pipe = DiffusionPipeline.from_pretrained(model, dtype=dtype)
    except (OSError, ValueError) as exc:
        raise ConfigError(f"could not load the pipeline {model!r}: {exc}") from exc
    pipe.set_progress_bar_config(disable=True)
    return pipe.to(device)
