"""A diffusers model built from its config with every parameter on the meta device (no memory).

Buffers stay real: they are small, and non-persistent ones (never in the checkpoint)
must hold what the constructor computes.
"""
from __future__ import annotations

import contextlib
import json
import os

import torch
from torch import nn


@contextlib.contextmanager
def meta_parameters():
    """Within this block, nn.Module parameters are created on the meta device."""
    original = nn.Module.register_parameter

    def register(module, name, param):
        original(module, name, param)
        if param is not None and param.device.type != "meta":
            kind = type(param)
            module._parameters[name] = kind(param.to("meta"), **getattr(param, "__dict__", {}))
            module._parameters[name].requires_grad_(param.requires_grad)

    nn.Module.register_parameter = register
    try:
        yield
    finally:
        nn.Module.register_parameter = original


def component_class(model_dir: str, name: str):
    """The diffusers class that model_index.json names for component `name`."""
    import diffusers

    with open(os.path.join(model_dir, "model_index.json")) as f:
        library, class_name = json.load(f)[name]
    if library != "diffusers":
        raise ValueError(f"component {name!r} is a {library} class; only diffusers models are built as skeletons")
    return getattr(diffusers, class_name)


def build_skeleton(model_dir: str, name: str) -> nn.Module:
    """Component `name` of a pipeline folder, parameters on meta, in eval mode like from_pretrained."""
    cls = component_class(model_dir, name)
    config = cls.load_config(os.path.join(model_dir, name))
    with meta_parameters():
        model = cls.from_config(config)
    return model.eval()


def expected_shapes(model: nn.Module) -> dict[str, tuple[int, ...]]:
    """Names and shapes of what a checkpoint must hold: parameters and persistent buffers."""
    return {name: tuple(t.shape) for name, t in model.state_dict().items()}


def set_tensor(model: nn.Module, name: str, tensor: torch.Tensor) -> None:
    """Puts `tensor` in place of parameter or buffer `name` (no copy)."""
    path, _, leaf = name.rpartition(".")
    module = model.get_submodule(path)
    if leaf in module._parameters:
        old = module._parameters[leaf]
        module._parameters[leaf] = nn.Parameter(tensor, requires_grad=old.requires_grad)
    else:
        module._buffers[leaf] = tensor


def param_bytes(model: nn.Module) -> int:
    """Bytes of parameters that hold memory (meta ones do not)."""
    return sum(p.numel() * p.element_size() for p in model.parameters() if p.device.type != "meta")
