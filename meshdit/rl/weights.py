"""update_weights: a trainer's new transformer weights written into what this rank holds, in the form it holds them.

Each rank keeps its layout: its PipeFusion stage's blocks (the other stages' names are skipped), its tensor-parallel
shards (a new weight is cut by the same LinearShard apply_tensor_parallel cut the loaded one by; a row-parallel
Linear's bias, which tp holds apart, is written there), FP8 Linear layers (the working-dtype weight re-quantized per
row, as when loading) and the dtype each tensor was loaded in. Tensors are swapped for fresh ones, never written
into: lean loading's weights may be views of a read-only mapping that other ranks share.
"""
from __future__ import annotations

import os
from collections.abc import Iterable, Mapping

import torch

from ..errors import ConfigError
from ..parallel.pipefusion import SkipBlock
from ..parallel.tensor import parameter_shard
from ..quant.fp8_linear import Fp8Linear
from ..quant.quantize import quantize_rows

LORA_PREFIX = "transformer."
"""diffusers' LoRA files name the transformer's tensors "transformer.<path>.lora_A.weight"."""


def named_tensors(weights) -> Iterable[tuple[str, torch.Tensor]]:
    """(name, tensor) pairs from a state dict, a .safetensors path, or an iterable of pairs."""
    if isinstance(weights, (str, os.PathLike)):
        from safetensors import safe_open

        if not os.path.isfile(weights):
            raise ConfigError(f"update_weights: {os.fspath(weights)!r} is not a file: pass a .safetensors file, a "
                              "state dict or (name, tensor) pairs.")
        with safe_open(os.fspath(weights), "pt") as f:
            for name in f.keys():
                yield name, f.get_tensor(name)
        return
    yield from (weights.items() if isinstance(weights, Mapping) else weights)


def update_transformer(transformer: torch.nn.Module, tensors: Iterable[tuple[str, torch.Tensor]], tensor_parallel,
                       stages, adapter: str | None = None) -> int:
    """Writes each (name, whole tensor) into `transformer` as this rank holds it; returns how many it holds here.

    Names are the transformer's state-dict names; with `adapter`, a LoRA file's names ("transformer.<path>.lora_A.
    weight") for that loaded adapter, whose tensors alone change. A name the model does not have is a ConfigError."""
    stand_ins = tuple(f"{spec.path}.{i}." for spec in stages.blocks
                      for i, block in enumerate(transformer.get_submodule(spec.path)) if isinstance(block, SkipBlock))
    written = 0
    for name, tensor in tensors:
        if adapter is not None:
            name = _adapter_name(name, adapter)
        if name.startswith(stand_ins):  # another PipeFusion stage's block
            continue
        _write(transformer, name, tensor.detach(), tensor_parallel)
        written += 1
    return written


def _adapter_name(name: str, adapter: str) -> str:
    """"transformer.<path>.lora_A.weight" -> peft's "<path>.lora_A.<adapter>.weight"."""
    name = name[len(LORA_PREFIX):] if name.startswith(LORA_PREFIX) else name
    for part in (".lora_A.", ".lora_B."):
        head, found, leaf = name.partition(part)
        if found:
            return f"{head}{part}{adapter}.{leaf}"
    raise ConfigError(f"update_weights(adapter={adapter!r}): {name!r} is no LoRA tensor (lora_A / lora_B): pass the "
                      "adapter's tensors only, named as in its .safetensors file.")


def _write(transformer, name: str, tensor: torch.Tensor, tensor_parallel) -> None:
    path, _, leaf = name.rpartition(".")
    try:
        module = transformer.get_submodule(path)
    except AttributeError:
        module = None
    held = None if module is None else module._parameters.get(leaf, module._buffers.get(leaf))
    if held is None and tensor_parallel is not None and leaf == "bias" and path in tensor_parallel.row_biases:
        bias = tensor_parallel.row_biases[path]  # a row-parallel Linear's bias, added once after the all-reduce
        bias.copy_(_checked(name, tensor.to(bias.device, bias.dtype), bias.shape))  # tp's own copy: written
        return
    if held is None:
        raise ConfigError(f"update_weights: {type(transformer).__name__} has no weight {name!r}: pass the "
                          "transformer's own state-dict names (e.g. from its state_dict(), or its safetensors file).")
    dtype = module.out_dtype if isinstance(module, Fp8Linear) and leaf == "weight" else held.dtype
    value = tensor.to(held.device, dtype, copy=True)  # [*whole]: a fresh tensor, the trainer's stays its own
    cut = parameter_shard(tensor_parallel.shards, name) if tensor_parallel is not None else None
    if cut is not None and value.shape[cut[0]] != len(cut[1]):
        value = value.index_select(cut[0], cut[1].to(value.device))  # this rank's shard, as loading cut it
    if isinstance(module, Fp8Linear) and leaf == "weight":
        q, scale = quantize_rows(_checked(name, value, held.shape), module.format)  # [out, in], [out, 1]
        module._buffers["weight"], module._buffers["weight_scale"] = q, scale.t().contiguous()
    elif leaf in module._parameters:
        held.data = _checked(name, value, held.shape)
    else:
        module._buffers[leaf] = _checked(name, value, held.shape)


def _checked(name: str, value: torch.Tensor, shape) -> torch.Tensor:
    if value.shape != shape:
        raise ConfigError(f"update_weights: {name!r} has shape {tuple(value.shape)}, the model's (as this rank holds "
                          f"it) {tuple(shape)}: pass weights of the same model.")
    return value
