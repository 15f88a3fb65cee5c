"""Load one diffusers model of a pipeline folder onto a skeleton, without a second copy of its weights."""
from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Callable

import torch
import torch.distributed as dist
from torch import nn

from .checkpoint import check_against, read_checkpoint
from .skeleton import build_skeleton, expected_shapes, param_bytes, set_tensor
from .transport import host_groups, shared_cast_tensors, shared_tensors, streamed_tensors


@dataclass
class LoadReport:
    tensors: int = 0
    param_bytes: int = 0  # parameter bytes this rank holds after loading (they only grow while loading)
    reader: int = 0  # the rank that read the files for this rank (itself with the shared mapping)


def load_model(model_dir: str, name: str, device: torch.device, dtype: torch.dtype,
               select: Callable[[nn.Module], Callable[[str], bool]] | None = None,
               transport: str = "shared", group=None,
               on_loaded: Callable[[nn.Module, str], None] | None = None) -> tuple[nn.Module, LoadReport]:
    """Component `name` with the tensors select(skeleton) keeps materialised on `device` (others stay on meta).

    Floating tensors are cast to `dtype` except in the class's _keep_in_fp32_modules,
    as from_pretrained does. Raises ConfigError naming the file and tensor on every rank
    when the checkpoint does not match the config (checked before any tensor moves).
    """
    model = build_skeleton(model_dir, name)
    keep = select(model) if select is not None else (lambda _: True)
    report = LoadReport(reader=dist.get_rank())
    if transport != "shared":
        host_ranks, group = host_groups(group)  # one reader per host: the lowest rank on it
        report.reader = host_ranks[0]
    entries = _agreed_entries(os.path.join(model_dir, name), transport, group)
    check_against(entries, expected_shapes(model))
    fp32_modules = getattr(model, "_keep_in_fp32_modules", None) or []

    def target_of(entry) -> torch.dtype:
        if not entry.dtype.is_floating_point:
            return entry.dtype
        return torch.float32 if any(m in entry.name.split(".") for m in fp32_modules) else dtype

    if transport == "shared" and device.type == "cpu" and any(target_of(e) != e.dtype for e in entries):
        arrivals = shared_cast_tensors(entries, keep, target_of, group)  # one cast copy per host
    elif transport == "shared":
        arrivals = shared_tensors(entries, keep)
    else:
        arrivals = streamed_tensors(entries, keep, device, group)
    for entry, tensor in arrivals:
        tensor = tensor.to(device=device, dtype=target_of(entry))  # no copy when the view already fits
        set_tensor(model, entry.name, tensor)
        if on_loaded is not None:
            on_loaded(model, entry.name)  # e.g. QuantizeWhileLoading
        report.tensors += 1
    report.param_bytes = param_bytes(model)
    return model, report


def _agreed_entries(folder: str, transport: str, group):
    """The checkpoint's entries; when streaming, read by the group's first rank and agreed by all (or its error raised by all)."""
    from ..errors import ConfigError

    if transport == "shared":
        return read_checkpoint(folder)  # every rank reads the same headers itself: no communication to hang on
    ranks = dist.get_process_group_ranks(group) if group is not None else list(range(dist.get_world_size()))
    box: list = [None]
    if dist.get_rank() == ranks[0]:
        try:
            box[0] = read_checkpoint(folder)
        except ConfigError as exc:
            box[0] = exc
    dist.broadcast_object_list(box, ranks[0], group=group)
    if isinstance(box[0], ConfigError):
        raise ConfigError(str(box[0]))
    return box[0]
