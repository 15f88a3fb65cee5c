"""Prompts encoded on one rank; the embeddings sent to the others, which never load text encoders.

Every rank runs the recipe's prepare() with the same request, so every rank calls
pipe.encode_prompt the same number of times in the same order: the encoding rank runs
the real one and broadcasts its outputs, the others receive them in place of running it.
"""
from __future__ import annotations

import torch
import torch.distributed as dist

from ..distributed.comm import broadcast_object

ENCODING_RANK = 0  # the output rank


def text_encoder_names(folder: str) -> list[str]:
    """Components of the pipeline folder that are text encoders (text_encoder, text_encoder_2, ...)."""
    import json
    import os

    with open(os.path.join(folder, "model_index.json")) as f:
        index = json.load(f)
    return [name for name, value in index.items()
            if name.startswith("text_encoder") and isinstance(value, list) and value[0] is not None]


def tree_to(value, device):
    """Every tensor of a nested tuple / list / dict moved to `device`."""
    if isinstance(value, torch.Tensor):
        return value.to(device)
    if isinstance(value, (tuple, list)):
        return type(value)(tree_to(v, device) for v in value)
    if isinstance(value, dict):
        return {k: tree_to(v, device) for k, v in value.items()}
    return value


def encode_on_one_rank(pipe, device: torch.device, encoder_device: torch.device) -> None:
    """Replaces pipe.encode_prompt on this rank by the encode-on-rank-0-and-broadcast version.

    encoder_device: where the text encoders run (the rank's device, or the CPU); the
    embeddings are moved to `device` (where the transformer runs) on every rank.
    """
    original = pipe.encode_prompt
    alone = not dist.is_initialized() or dist.get_world_size() == 1
    encoding = alone or dist.get_rank() == ENCODING_RANK

    def encode_prompt(*args, **kwargs):
        box = [None]  # (status, embeddings or error text)
        if encoding:
            kwargs["device"] = encoder_device
            try:
                with torch.inference_mode():
                    box[0] = ("ok", tree_to(original(*args, **kwargs), "cpu"))  # objects travel via the CPU
            except Exception as exc:  # noqa: BLE001 - every rank raises it, none waits forever
                box[0] = ("error", f"{type(exc).__name__}: {exc}")
                if alone:
                    raise
        if not alone:
            box[0] = broadcast_object(box[0], ENCODING_RANK, dist.group.WORLD, "text_embeddings_broadcast")
        status, value = box[0]
        if status == "error":
            raise RuntimeError(f"encoding the prompt on rank {ENCODING_RANK} failed: {value}")
        return tree_to(value, device)

    pipe.encode_prompt = encode_prompt
