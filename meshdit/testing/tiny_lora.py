"""LoRA adapter files for the tiny models, made in code: a random PEFT adapter on the transformer's attention
projections, saved with the pipeline's own `save_lora_weights` (the file diffusers' `load_lora_weights` reads)."""
from __future__ import annotations

import os

import torch

from .tiny_models import tiny_pipeline

TARGETS = ["to_q", "to_k", "to_v", "to_out.0"]  # attention projections every tiny DiT family names so


def save_tiny_lora(pipeline, path: str, seed: int = 0, rank: int = 2, scale: float | None = 0.5) -> str:
    """Writes an adapter for `pipeline` (a tiny_pipeline name, or a pipeline this call may spoil: adding an
    adapter wraps its Linear layers) to `path` (a .safetensors file) and returns the path.

    It adapts TARGETS in every block of every block list (FLUX.1's single blocks' to_q/k/v included), as
    diffusers' training scripts do. lora_A and lora_B are random (scale x N(0, 1), from `seed`), so the adapter
    changes the image; scale None: peft's own random init (LoraConfig(init_lora_weights=False), from `seed`)."""
    from peft import LoraConfig
    from peft.utils import get_peft_model_state_dict

    pipe = tiny_pipeline(pipeline) if isinstance(pipeline, str) else pipeline
    transformer = pipe.transformer
    with torch.random.fork_rng():  # peft's init draws from the global generator: seeded, and left as it was
        torch.manual_seed(seed)
        transformer.add_adapter(LoraConfig(r=rank, lora_alpha=rank, target_modules=TARGETS,
                                           init_lora_weights=scale is not None), adapter_name="tiny")
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, param in transformer.named_parameters():
            if ".lora_" in name and scale is not None:
                param.copy_(torch.randn(param.shape, generator=generator) * scale)
    state = get_peft_model_state_dict(transformer, adapter_name="tiny")
    folder, file = os.path.split(os.path.abspath(path))
    type(pipe).save_lora_weights(folder, transformer_lora_layers=state, weight_name=file)
    return path
