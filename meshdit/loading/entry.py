"""The loading entry point: a diffusers pipeline from a folder or a Hub id, plain or memory-efficient on a mesh."""
from __future__ import annotations

import torch

from ..errors import ConfigError


def default_dtype(device: torch.device) -> torch.dtype:
    """bf16 on GPUs, fp32 on CPU (CPU bf16 matmuls are slow and less exact)."""
    return torch.bfloat16 if device.type == "cuda" else torch.float32


def load_pipeline(model: str, device: torch.device, torch_dtype: torch.dtype | None = None, mesh=None,
                  options=None, vae_here: bool = True, fp8_gemm: bool = False):
    """The pipeline on `device`; on a multi-rank mesh, memory-efficiently unless options turn it off.

    vae_here=False (a rank that does not decode): a memory-efficient load leaves the VAE's
    weights on the meta device; its config still serves the pipeline. fp8_gemm: a memory-efficient
    load makes the block lists' Linear layers FP8 as their weights arrive (else parallelize does, after).
    """
    from .options import LoadOptions

    dtype = torch_dtype or default_dtype(device)
    options = options or LoadOptions()
    if mesh is not None and options.efficient(mesh.config.world_size):
        from .pipeline import load_pipeline_efficiently

        return load_pipeline_efficiently(model, device, dtype, mesh, options, vae_here, fp8_gemm)
    from diffusers import DiffusionPipeline

    from .processors import processor_substitutes

    try:
        pipe = DiffusionPipeline.from_pretrained(model, dtype=dtype, **processor_substitutes(model))
    except (OSError, ValueError) as exc:
        raise ConfigError(f"could not load the pipeline {model!r}: {exc}") from exc
    pipe.set_progress_bar_config(disable=True)
    if options.text_encoder_parallel:  # before the move: the device holds only this rank's stage
        from .text_stages import split_text_encoders

        split_text_encoders(pipe, [n for n in pipe.components if n.startswith("text_encoder")])
    pipe.to(device)
    if options.text_encoder_device:  # text encoders stay there; embeddings move to `device`
        from .text import encode_on_one_rank

        encoder_device = torch.device(options.text_encoder_device)
        for name, component in pipe.components.items():
            if name.startswith("text_encoder") and component is not None:
                component.to(encoder_device)
        encode_on_one_rank(pipe, device, encoder_device)
    return pipe
