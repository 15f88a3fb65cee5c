"""Local attention that also returns the log-sum-exp (LSE) ring attention merges with."""
from __future__ import annotations

import math

import torch


def attention_with_lse(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """softmax(q kᵀ · scale) v and its row log-sum-exp.

    q: [B, H, Sq, D], k/v: [B, H, Sk, D] -> out [B, H, Sq, D], lse [B, H, Sq] (fp32).
    CPU uses aten's flash attention for CPU (torch's public SDPA drops the LSE);
    CUDA/ROCm uses the memory-efficient kernel with compute_log_sumexp.
    """
    if k.shape[-2] == 0:  # an empty K/V block contributes nothing
        lse = torch.full(q.shape[:-1], float("-inf"), dtype=torch.float32, device=q.device)
        return torch.zeros_like(q), lse
    if q.device.type == "cpu":
        out, lse = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(q, k, v, 0.0, False, scale=scale)[:2]
        return out, lse.float()
    if q.device.type == "cuda":
        out, lse = torch.ops.aten._scaled_dot_product_efficient_attention(
            q, k, v, None, True, 0.0, False, scale=scale
        )[:2]
        return out, lse[..., : q.shape[-2]].float()  # the kernel may pad the LSE's length
    return _math_attention_with_lse(q, k, v, scale)


def _math_attention_with_lse(q, k, v, scale):
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
    scores = torch.matmul(q.float(), k.float().transpose(-1, -2)) * scale  # [B, H, Sq, Sk]
    lse = torch.logsumexp(scores, dim=-1)
    out = torch.matmul(torch.softmax(scores, dim=-1), v.float()).to(q.dtype)
    return out, lse


def merge_attention(
    out: torch.Tensor | None, lse: torch.Tensor | None, block_out: torch.Tensor, block_lse: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Combines attention over two disjoint key sets from their outputs and LSEs.

    out = Σ exp(lse_i − lse) · out_i with lse = logaddexp(lse_1, lse_2); kept in fp32.
    """
    block_out = block_out.float()
    if out is None:
        return block_out, block_lse
    new_lse = torch.logaddexp(lse, block_lse)
    # exp(-inf - -inf) would be nan: a row no block has seen yet keeps weight 0
    w_old = torch.exp(lse - new_lse).nan_to_num(0.0).unsqueeze(-1)
    w_new = torch.exp(block_lse - new_lse).nan_to_num(0.0).unsqueeze(-1)
    return out * w_old + block_out * w_new, new_lse
