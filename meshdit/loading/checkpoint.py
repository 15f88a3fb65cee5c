"""A component's safetensors files read from their headers only: every tensor's file, dtype, shape and bytes.

Checked before any tensor moves, so a missing, truncated or corrupt file, or a tensor that
does not match the model's config, is refused on every rank with the file and tensor named.
"""
from __future__ import annotations

import json
import os
from dataclasses import dataclass

import torch

from ..config_files import read_safetensors_header
from ..errors import ConfigError

DTYPES = {
    "F64": torch.float64, "F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16,
    "I64": torch.int64, "I32": torch.int32, "I16": torch.int16, "I8": torch.int8, "U8": torch.uint8,
    "BOOL": torch.bool, "F8_E4M3": torch.float8_e4m3fn, "F8_E5M2": torch.float8_e5m2,
}
WEIGHTS_NAME = "diffusion_pytorch_model.safetensors"
INDEX_NAME = WEIGHTS_NAME + ".index.json"


@dataclass(frozen=True)
class TensorEntry:
    name: str
    path: str
    dtype: torch.dtype
    shape: tuple[int, ...]
    start: int  # byte offset of the data in the file
    nbytes: int


def checkpoint_files(folder: str) -> list[str]:
    """The safetensors files of a diffusers component folder (one file, or shards listed in the index)."""
    single = os.path.join(folder, WEIGHTS_NAME)
    index = os.path.join(folder, INDEX_NAME)
    if os.path.exists(index):
        try:
            with open(index) as f:
                shards = sorted(set(json.load(f)["weight_map"].values()))
        except (OSError, ValueError, KeyError) as exc:
            raise ConfigError(f"cannot read the shard index {index}: {exc}") from None
        return [os.path.join(folder, s) for s in shards]
    if os.path.exists(single):
        return [single]
    raise ConfigError(f"no safetensors weights in {folder} (expected {WEIGHTS_NAME} or {INDEX_NAME}); "
                      "use --no-memory-efficient-load for other formats")


def read_entries(path: str) -> list[TensorEntry]:
    """Parses one file's header and checks that every tensor's bytes lie inside the file."""
    header, header_len = read_safetensors_header(path)
    size = os.path.getsize(path)
    data_start = 8 + header_len
    entries = []
    for name, meta in header.items():
        try:
            dtype = DTYPES[meta["dtype"]]
            shape = tuple(int(d) for d in meta["shape"])
            begin, end = (int(x) for x in meta["data_offsets"])
        except (KeyError, TypeError, ValueError):
            raise ConfigError(f"{path}: corrupt safetensors header entry for tensor {name!r}: {meta}") from None
        numel = 1
        for d in shape:
            numel *= d
        if end - begin != numel * dtype.itemsize or begin < 0:
            raise ConfigError(f"{path}: tensor {name!r} spans {end - begin} bytes, its shape {list(shape)} "
                              f"and dtype need {numel * dtype.itemsize}")
        if data_start + end > size:
            raise ConfigError(f"{path}: truncated: tensor {name!r} ends at byte {data_start + end}, "
                              f"the file has {size}")
        entries.append(TensorEntry(name, path, dtype, shape, data_start + begin, end - begin))
    return entries


def read_checkpoint(folder: str) -> list[TensorEntry]:
    """All tensors of a component, in a fixed order (file, then position in the file)."""
    entries = [e for path in checkpoint_files(folder) for e in read_entries(path)]
    return sorted(entries, key=lambda e: (e.path, e.start))


def check_against(entries: list[TensorEntry], expected: dict[str, tuple[int, ...]]) -> None:
    """Every expected tensor is present with the config's shape, and no stray one is present."""
    by_name = {e.name: e for e in entries}
    for name, shape in expected.items():
        entry = by_name.get(name)
        if entry is None:
            raise ConfigError(f"tensor {name!r} is missing from the weights files "
                              f"{sorted({e.path for e in entries})}")
        if entry.shape != tuple(shape):
            raise ConfigError(f"{entry.path}: tensor {name!r} has shape {list(entry.shape)}, the model's config "
                              f"gives {list(shape)}")
    stray = [e for e in entries if e.name not in expected]
    if stray:
        raise ConfigError(f"{stray[0].path}: tensor {stray[0].name!r} is not in the model built from its config "
                          f"({len(stray)} such tensors)")
