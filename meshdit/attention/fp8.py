"""FP8 attention: Q, K, V and the probabilities quantized to FP8 with per-block scales.

On CPU (and on GPUs without an FP8 attention kernel) this is an exact emulation
of what FP8 attention kernels compute: quantize each operand per block, dequantize,
multiply in float32. The probabilities are quantized after the row maximum is
subtracted (values in [0, 1]) per block of keys, and the row sums come from the
unquantized probabilities, as kernels accumulate them in float32. It returns the
log-sum-exp, so ring attention and USP merge its partial results.

K and V are smoothed before quantizing, as SageAttention does: their mean over the
tokens of the call is subtracted (a channel-wise offset that FP8 would otherwise spend
its 3 mantissa bits on) and added back exactly: every score of a query row moves by the
same q·mean(K), so the probabilities are unchanged and only the log-sum-exp takes that
shift back (in float32); the probabilities sum to 1, so the output takes mean(V) back.
What this gains on the bundled model is measured in docs/fp8.md ("--attention-backend fp8").
"""
from __future__ import annotations

import logging

import torch

from ..quant.formats import fp8_dtype
from ..quant.quantize import fake_quantize_blocks

BLOCK = 64  # tokens per scale block (Q rows, K/V rows, probability columns), as in FA3/SageAttention tiles
_QUERY_CHUNK = 1024  # queries per score matrix, to bound memory
log = logging.getLogger("meshdit.fp8")


def fp8_attention_with_lse(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float | None = None
                           ) -> tuple[torch.Tensor, torch.Tensor]:
    """q: [B, H, Sq, D], k/v: [B, H, Sk, D] -> out [B, H, Sq, D] (q's dtype), lse [B, H, Sq] (float32)."""
    if k.shape[-2] == 0:
        return torch.zeros_like(q), torch.full(q.shape[:-1], float("-inf"), device=q.device)
    kernel = gpu_kernel(q.device)
    if kernel is not None:
        result = kernel(q, k, v, scale)
        if result is not None:
            return result
    return emulated_fp8_attention(q, k, v, scale)


def emulated_fp8_attention(q, k, v, scale=None, fmt: torch.dtype | None = None):
    fmt = fmt or fp8_dtype(q.device)
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    (k, k_mean), (v, v_mean) = smoothed(k), smoothed(v)
    qd, kd, vd = (fake_quantize_blocks(t, BLOCK, dim=2, dtype=fmt) for t in (q, k, v))  # float32
    outs, lses = [], []
    for q_chunk in qd.split(_QUERY_CHUNK, dim=2):
        scores = torch.matmul(q_chunk, kd.transpose(-1, -2)) * scale  # [B, H, sq, Sk]
        row_max = scores.amax(dim=-1, keepdim=True)
        p = torch.exp(scores - row_max)  # in [0, 1]
        row_sum = p.sum(dim=-1, keepdim=True)
        pq = fake_quantize_blocks(p, BLOCK, dim=-1, dtype=fmt)  # per row and block of keys
        outs.append(torch.matmul(pq, vd) / row_sum)
        lses.append((row_max + row_sum.log()).squeeze(-1))
    out, lse = torch.cat(outs, dim=2) + v_mean, torch.cat(lses, dim=2)
    return out.to(q.dtype), lse + smoothing_shift(q, k_mean, scale)


def smoothed(t: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """t [B, H, S, D] -> (t - mean over S in float32, the mean [B, H, 1, D])."""
    mean = t.float().mean(dim=2, keepdim=True)
    return t.float() - mean, mean


def smoothing_shift(q: torch.Tensor, k_mean: torch.Tensor, scale: float) -> torch.Tensor:
    """What subtracting k_mean took off every score of a query row: [B, H, Sq] (float32)."""
    return torch.matmul(q.float(), k_mean.transpose(-1, -2)).squeeze(-1) * scale


_KERNELS: dict = {}


def gpu_kernel(device: torch.device):
    """The real FP8 attention kernel for `device`, or None (then: emulation). Detected once; logged."""
    if device.type != "cuda":
        return None
    if device not in _KERNELS:
        _KERNELS[device] = _detect(device)
    return _KERNELS[device]


def _detect(device):
    try:
        import flash_attn_interface  # FlashAttention-3 (Hopper): FP8 forward with per-head descales
    except ImportError:
        log.warning("meshdit: no FP8 attention kernel on %s (FlashAttention-3 not installed): "
                    "--attention-backend fp8 runs the emulation, which is slower than sdpa", device)
        return None
    log.warning("meshdit: --attention-backend fp8 uses FlashAttention-3's FP8 kernel on %s", device)
    return lambda q, k, v, scale: _fa3(flash_attn_interface, q, k, v, scale)


def _fa3(fa3, q, k, v, scale):
    """FA3 FP8 forward: per (batch, head) scales; layout [B, S, H, D]. None if the call is refused."""
    fmt = torch.float8_e4m3fn
    limit = torch.finfo(fmt).max
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    (k_s, k_mean), (v_s, v_mean) = smoothed(k), smoothed(v)
    quantized, descales = [], []
    for t in (q, k_s, v_s):
        s = t.abs().amax(dim=(2, 3)).float().clamp_min(1e-12) / limit  # [B, H]
        quantized.append((t.float() / s[..., None, None]).clamp(-limit, limit).to(fmt).transpose(1, 2).contiguous())
        descales.append(s)
    try:
        # versions differ: some return out, others (out, lse, ...) (with return_attn_probs)
        result = fa3.flash_attn_func(*quantized, softmax_scale=scale, q_descale=descales[0],
                                     k_descale=descales[1], v_descale=descales[2], return_attn_probs=True)
        if not isinstance(result, (tuple, list)) or len(result) < 2:
            raise RuntimeError("this FlashAttention-3 build does not return the log-sum-exp")
        out, lse = result[0], result[1]  # [B, Sq, H, D], [B, H, Sq]
    except Exception as exc:  # noqa: BLE001 - an FA3 build without FP8 or LSE: fall back, loudly, once
        log.warning("meshdit: FlashAttention-3 FP8 call failed (%s); using the emulation", exc)
        _KERNELS[q.device] = None
        return None
    out = out.transpose(1, 2).float() + v_mean
    return out.to(q.dtype), lse.float() + smoothing_shift(q, k_mean, scale)
