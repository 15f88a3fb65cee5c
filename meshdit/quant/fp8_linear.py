"""Linear layers with FP8 weights (per-output-channel scales) and per-token FP8 activations.

The weight is quantized once, when the layer is converted; each call quantizes
its input per token and runs torch._scaled_mm, which accumulates in float32 and
applies both scales and the bias (CPU, CUDA and ROCm).
"""
from __future__ import annotations

import torch
from torch import nn

from .formats import fp8_dtype
from .quantize import quantize_rows


class Fp8Linear(nn.Module):
    def __init__(self, linear: nn.Linear) -> None:
        super().__init__()
        self.in_features, self.out_features = linear.in_features, linear.out_features
        self.out_dtype = linear.weight.dtype  # the working dtype outputs come back in
        self.format = fp8_dtype(linear.weight.device)
        q, scale = quantize_rows(linear.weight.detach(), self.format)  # [out, in], [out, 1]
        # _scaled_mm wants its second operand column-major: Wᵀ as a view of the row-major [out, in] weight
        self.register_buffer("weight", q, persistent=False)  # [out, in] FP8
        self.register_buffer("weight_scale", scale.t().contiguous(), persistent=False)  # [1, out] float32
        bias = linear.bias.detach() if linear.bias is not None else None
        self.register_buffer("bias", bias, persistent=False)
        self.stands_for_numel = sum(p.numel() for p in linear.parameters())  # PipeFusion balances stages by it

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        lead = x.shape[:-1]
        q, scale = quantize_rows(x.reshape(-1, self.in_features), self.format)  # [M, in], [M, 1]
        bias = self.bias.to(self.out_dtype) if self.bias is not None and self.out_dtype != torch.float32 else self.bias
        out = torch._scaled_mm(q, self.weight.t(), scale_a=scale, scale_b=self.weight_scale, bias=bias,
                               out_dtype=self.out_dtype)
        return out.reshape(*lead, self.out_features)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, format={self.format}"


ADAPTER_PREFIX = "lora_"
"""peft's adapter modules under a LoRA layer (lora_A, lora_B, ...): they stay in the working dtype beside the FP8
base layer, so an adapter adds exactly its own low-rank term to the FP8 product."""


def quantize_linears(root: nn.Module) -> int:
    """Replaces every nn.Linear under `root` by an Fp8Linear (under a peft LoRA layer: its base layer, not the
    adapters); returns how many."""
    count = 0
    for name, child in list(root.named_children()):
        if name.startswith(ADAPTER_PREFIX):
            continue
        if isinstance(child, nn.Linear):
            setattr(root, name, Fp8Linear(child))
            count += 1
        else:
            count += quantize_linears(child)
    return count


def quantize_block_lists(transformer: nn.Module, paths: list[str]) -> int:
    """FP8 weights for the Linear layers of the named block lists (embedders, norms, final projection stay)."""
    modules = dict(transformer.named_modules())
    return sum(quantize_linears(modules[path]) for path in paths)


class QuantizeWhileLoading:
    """on_loaded(model, name) for meshdit's loader: each Linear of the block lists becomes an Fp8Linear
    as soon as its last tensor arrives, so a rank never holds more than one layer's working-dtype
    weights beside the FP8 ones (the GPU need not fit the unquantized model)."""

    def __init__(self, block_paths: list[str]) -> None:
        self.prefixes = tuple(f"{path}." for path in block_paths)

    def __call__(self, model: nn.Module, name: str) -> None:
        path = name.rpartition(".")[0]
        if not path.startswith(self.prefixes):
            return
        linear = model.get_submodule(path)
        if isinstance(linear, nn.Linear) and all(p.device.type != "meta" for p in linear.parameters()):
            parent, _, leaf = path.rpartition(".")
            setattr(model.get_submodule(parent), leaf, Fp8Linear(linear))
