"""PipeFusion's stale-K/V attention: a patch's queries over the whole image's keys and values.

Every attention layer keeps a full-sequence K/V buffer per guidance branch: a patch
refreshes its own slice and attends to the rest as last computed (this step for
earlier patches, the previous step for later ones). With sequence parallelism inside
a stage the same Ulysses-in / Ulysses-out arithmetic as usp_attention applies
(usp.UspLayout); across the ring the patch's fresh K/V are gathered instead of
passed around, since every SP rank keeps the whole stale K/V.
"""
from __future__ import annotations

from contextlib import contextmanager

import torch

from ..distributed.comm import all_gather_uneven
from .usp import UspLayout, ulysses_in, ulysses_out


class StaleKV:
    """Full-sequence K/V per attention layer and guidance branch, refreshed patch by patch."""

    def __init__(self, state) -> None:
        self.state = state  # the sequence hooks' state: patch window, stream lengths, SP groups, codecs
        self._branch: str | None = None
        self.buffers: dict = {}

    def reset(self) -> None:
        self.buffers.clear()

    @contextmanager
    def for_branch(self, branch: str):
        """Forwards inside read and refresh `branch`'s buffers."""
        self._branch = branch
        try:
            yield
        finally:
            self._branch = None

    def attention(self, active, q, k, v, scale):
        """q, k, v: [B, H, S_local, D] for this rank's tokens of the patch -> [B, H, S_local, D]."""
        state = self.state
        streams = active.streams
        lens = {s: state.lens(s) for s in streams}  # per SP rank
        per_rank = [sum(lens[s][r] for s in streams) for r in range(state.sp_size)]
        groups = state.groups
        layout = UspLayout.of(groups, per_rank)
        num_heads = q.shape[1]
        q, k, v = ulysses_in(q, k, v, groups, layout, state.codecs)  # my Ulysses group's tokens, a head shard
        if groups.ring_size > 1:
            # the ring ranks share the patch's fresh K/V (in SP rank order, as _by_stream expects)
            k, v = (all_gather_uneven(t, 2, layout.run_lens, groups.ring_group) for t in (k, v))
        buffers = self.buffers.setdefault((active.module_name, self._branch), {})
        keys, values = [], []
        patch = state.patch
        for stream, (fresh_k, fresh_v) in _by_stream(k, v, streams, lens).items():
            start = patch[0] if patch is not None and stream == state.PATCHED_STREAM else 0
            if stream not in buffers:
                shape = (*fresh_k.shape[:2], state.full_lens[stream], fresh_k.shape[-1])
                buffers[stream] = (fresh_k.new_zeros(shape), fresh_v.new_zeros(shape))
            buf_k, buf_v = buffers[stream]  # [B, H/U, S_stream, D]
            buf_k.narrow(2, start, fresh_k.shape[2]).copy_(fresh_k)
            buf_v.narrow(2, start, fresh_v.shape[2]).copy_(fresh_v)
            keys.append(buf_k)
            values.append(buf_v)
        out = state.local_attention(q, torch.cat(keys, dim=2), torch.cat(values, dim=2), scale)
        return ulysses_out(out, groups, layout, num_heads, state.codecs)


def _by_stream(k, v, streams, lens):
    """Gathered [rank0: s1 s2 | rank1: s1 s2 | ...] -> {stream: its tokens in order} for k and v."""
    pieces = {s: ([], []) for s in streams}
    offset = 0
    for rank in range(len(next(iter(lens.values())))):
        for s in streams:
            n = lens[s][rank]
            pieces[s][0].append(k.narrow(2, offset, n))
            pieces[s][1].append(v.narrow(2, offset, n))
            offset += n
    return {s: (torch.cat(ks, dim=2), torch.cat(vs, dim=2)) for s, (ks, vs) in pieces.items()}
