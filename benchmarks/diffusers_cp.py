"""diffusers' own context parallelism (Ulysses, Ring), made to run on CPU with gloo.

diffusers 0.42.1 assumes an accelerator in two places; this is the whole shim:

1. `ModelMixin._resolve_parallel_config` computes `rank % torch.accelerator.device_count()`,
   which is 0 on a CPU-only machine (ZeroDivisionError). While `enable_parallelism`
   runs, `torch.accelerator.device_count` reports 1. The device it computes is
   only recorded; the mesh is made with `torch._C._get_accelerator().type`, which is
   already "cpu".
2. Its ring attention (`TemplatedRingAttention`) asks the backend's forward op for
   the log-sum-exp. The default "native" backend's op (`_native_attention_forward_op`,
   torch's public SDPA) raises on `return_lse=True`. We wrap that op: with
   `return_lse` it calls `torch.ops.aten._scaled_dot_product_flash_attention_for_cpu`,
   which returns (out, lse); otherwise the original op runs unchanged. Ulysses
   never asks for the LSE, so it runs diffusers' code untouched.

Nothing else is changed: diffusers' own cp_plan, hooks, all-to-all and all-gather
(functional collectives over gloo) run as shipped.
"""
from __future__ import annotations

import contextlib

import torch

_PATCHED = False


def _cpu_lse_forward_op(original):
    def forward_op(ctx, query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None,
                   enable_gqa=False, return_lse=False, _save_ctx=True, _parallel_config=None):
        if not return_lse or query.device.type != "cpu":
            return original(ctx, query, key, value, attn_mask, dropout_p, is_causal, scale, enable_gqa, return_lse,
                            _save_ctx=_save_ctx, _parallel_config=_parallel_config)
        if attn_mask is not None or enable_gqa:
            raise NotImplementedError("the CPU LSE shim supports unmasked attention without GQA")
        q, k, v = (x.transpose(1, 2) for x in (query, key, value))  # diffusers' [B, S, H, D] -> [B, H, S, D]
        out, lse = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(
            q, k, v, dropout_p, is_causal, scale=scale)[:2]
        return out.transpose(1, 2), lse.transpose(1, 2)  # [B, S, H, D], [B, S, H]

    return forward_op


def install_cpu_shim() -> None:
    """Patch 2 (module-level, idempotent): the native forward op returns the LSE on CPU when asked."""
    global _PATCHED
    if _PATCHED:
        return
    from diffusers.models import attention_dispatch

    attention_dispatch._native_attention_forward_op = _cpu_lse_forward_op(
        attention_dispatch._native_attention_forward_op)
    _PATCHED = True


@contextlib.contextmanager
def _one_accelerator():
    """Patch 1, only while enable_parallelism resolves its device."""
    original = torch.accelerator.device_count
    torch.accelerator.device_count = lambda: max(1, original())
    try:
        yield
    finally:
        torch.accelerator.device_count = original


def enable_context_parallel(transformer, ring_degree: int = 1, ulysses_degree: int = 1) -> None:
    """transformer.enable_parallelism(config=ContextParallelConfig(...)), on CPU if need be.

    NOTE: every rank must call this, in the same order (it builds a DeviceMesh).
    """
    from diffusers import ContextParallelConfig

    install_cpu_shim()
    config = ContextParallelConfig(ring_degree=ring_degree, ulysses_degree=ulysses_degree)
    with _one_accelerator():
        transformer.enable_parallelism(config=config)


# -- byte counting (only while counting: the timed runs call diffusers' collectives unwrapped) --

@contextlib.contextmanager
def count_functional_collectives(add):
    """Calls add(kind, bytes_sent_by_this_rank) for each functional collective diffusers issues."""
    import torch.distributed as dist
    import torch.distributed._functional_collectives as funcol

    orig_a2a, orig_ag = funcol.all_to_all_single, funcol.all_gather_tensor

    def all_to_all_single(x, output_split_sizes, input_split_sizes, group, *args, **kwargs):
        n = dist.get_world_size(group)
        if input_split_sizes is None:  # equal splits: everything but my own chunk leaves this rank
            sent = x.numel() * (n - 1) // n
        else:
            sent = x[0].numel() * (sum(input_split_sizes) - input_split_sizes[dist.get_rank(group)])
        add("all_to_all", sent * x.element_size())
        return orig_a2a(x, output_split_sizes, input_split_sizes, group, *args, **kwargs)

    def all_gather_tensor(x, gather_dim, group, *args, **kwargs):
        n = dist.get_world_size(group)
        add("all_gather", x.numel() * x.element_size() * (n - 1))
        return orig_ag(x, gather_dim, group, *args, **kwargs)

    funcol.all_to_all_single, funcol.all_gather_tensor = all_to_all_single, all_gather_tensor
    try:
        yield
    finally:
        funcol.all_to_all_single, funcol.all_gather_tensor = orig_a2a, orig_ag
