"""Text encoders split over the ranks: each rank keeps a contiguous run of every encoder's layers (`--text-encoder-parallel`).

A text encoder's layers (the ModuleList holding most of its parameters: T5's `encoder.block`, CLIP's
`text_model.encoder.layers`, a decoder LLM's `layers`) are cut into as many contiguous stages as there are ranks,
balanced by count. Every rank runs the encoder's own forward with the same prompt (every rank calls
`encode_prompt` in the same order, as for one-rank encoding): a layer's owner computes it and broadcasts what it
returned; the other ranks hold a parameter-free stand-in that returns the broadcast. The embeddings are therefore
the one-process encoder's, on every rank; the rest of the encoder (token embeddings, final norm, projections) is
small and stays whole on every rank.

Each rank loads the whole encoder into host memory and keeps only its stage: the device (the memory that is short)
holds one stage, the host holds a full copy per rank only while loading.
"""
from __future__ import annotations

import torch
import torch.distributed as dist
from torch import nn

from ..distributed.comm import broadcast_object, group_rank, group_size
from .text import tree_to


def encoder_layers(encoder: nn.Module) -> tuple[str, nn.ModuleList]:
    """(path, list) of the encoder's layers: its ModuleList holding the most parameters."""
    best, best_params = None, 0
    for path, module in encoder.named_modules():
        if isinstance(module, nn.ModuleList) and len(module) > 1:
            params = sum(p.numel() for p in module.parameters())
            if params > best_params:
                best, best_params = (path, module), params
    if best is None:
        raise ValueError(f"{type(encoder).__name__} has no list of layers to split over the ranks")
    return best


def stage_of(layer: int, layers: int, stages: int) -> int:
    """The stage owning `layer` of `layers` cut into `stages` contiguous runs (sizes differ by at most one)."""
    return next(s for s in range(stages) if layer < (s + 1) * layers // stages)


class _OwnedLayer(nn.Module):
    """The layer this rank owns: runs it and broadcasts its output (or its error) to the group."""

    def __init__(self, layer: nn.Module, src: int, group) -> None:
        super().__init__()
        self.layer, self.src, self.group = layer, src, group

    def forward(self, *args, **kwargs):
        try:
            out = self.layer(*args, **kwargs)
        except Exception as exc:  # noqa: BLE001 - every rank raises it, none waits forever
            broadcast_object(("error", f"{type(exc).__name__}: {exc}"), self.src, self.group, "text_encoder_stage")
            raise
        broadcast_object(("ok", tree_to(out, "cpu")), self.src, self.group, "text_encoder_stage")
        return out


class _ReceivedLayer(nn.Module):
    """Another rank's layer: no parameters; returns what its owner broadcast."""

    def __init__(self, src: int, group, owner_class: str) -> None:
        super().__init__()
        self.src, self.group, self.owner_class = src, group, owner_class

    def forward(self, *args, **kwargs):
        device = next((a.device for a in list(args) + list(kwargs.values()) if isinstance(a, torch.Tensor)), "cpu")
        status, value = broadcast_object(None, self.src, self.group, "text_encoder_stage")
        if status == "error":
            raise RuntimeError(f"text encoder layer ({self.owner_class}) on rank {self.src} failed: {value}")
        return tree_to(value, device)

    def extra_repr(self) -> str:
        return f"{self.owner_class} held by group rank {self.src}"


def split_text_encoder(encoder: nn.Module, group=None) -> tuple[int, int]:
    """Keeps this rank's stage of the encoder's layers in place; the others become stand-ins (their weights freed).

    Returns (first, end) of this rank's layers. Every rank of `group` must call it, and then run the encoder with
    the same inputs in the same order."""
    ranks, me = group_size(group), group_rank(group)
    _, layers = encoder_layers(encoder)
    mine = [i for i in range(len(layers)) if stage_of(i, len(layers), ranks) == me]
    for i, layer in enumerate(layers):
        owner = stage_of(i, len(layers), ranks)
        layers[i] = _OwnedLayer(layer, owner, group) if owner == me else \
            _ReceivedLayer(owner, group, type(layer).__name__)
    return (mine[0], mine[-1] + 1) if mine else (0, 0)


def split_text_encoders(pipe, names: list[str], group=None) -> dict[str, tuple[int, int]]:
    """split_text_encoder for each of the pipeline's text encoders over `group` (default: every rank, which all
    encode every request's prompts); {name: (first, end)}."""
    if not dist.is_initialized():
        return {}
    group = dist.group.WORLD if group is None else group
    if group_size(group) == 1:
        return {}
    return {name: split_text_encoder(getattr(pipe, name), group) for name in names
            if isinstance(getattr(pipe, name, None), nn.Module)}
