"""Ring attention: K/V blocks travel around a ring of ranks; partial results merge by LSE."""
from __future__ import annotations

import torch
from torch.distributed import ProcessGroup

from ..distributed.comm import RingExchange, group_rank
from .kernels import attention_with_lse, merge_attention


def ring_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    group: ProcessGroup,
    kv_lens: list[int],
    scale: float | None = None,
    codec=None,
    attention=attention_with_lse,
) -> torch.Tensor:
    """Exact attention of local queries over the K/V of every rank in the ring.

    q: [B, H, Sq, D]; k, v: [B, H, kv_lens[me], D] (the lengths may differ per rank).
    Returns [B, H, Sq, D]. The next block is in flight while the current one computes.
    `codec` encodes the K/V blocks on the wire; `attention(q, k, v, scale) -> (out, lse)` is the kernel.
    NOTE: every rank of `group` must call this with the same kv_lens.
    """
    world = len(kv_lens)
    me = group_rank(group)
    exchange = RingExchange(group, codec) if world > 1 else None
    block = torch.stack([k, v])  # [2, B, H, S_kv, D]: one message per hop
    out = lse = None
    for step in range(world):
        source = (me - step) % world  # whose K/V `block` holds now
        if step < world - 1:
            incoming = (me - step - 1) % world
            shape = (*block.shape[:3], kv_lens[incoming], block.shape[-1])
            exchange.start(block, shape)
        block_out, block_lse = attention(q, block[0], block[1], scale)
        out, lse = merge_attention(out, lse, block_out, block_lse)
        assert block.shape[-2] == kv_lens[source]
        if step < world - 1:
            block = exchange.wait()
    return out.to(q.dtype)
