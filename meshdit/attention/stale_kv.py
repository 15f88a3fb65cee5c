"""PipeFusion's stale-K/V attention: a patch's queries over the whole image's keys and values.

Every attention layer keeps a full-sequence K/V buffer per guidance branch: a patch
refreshes its own slice and attends to the rest as last computed (this step for
earlier patches, the previous step for later ones). With sequence parallelism inside
a stage the same Ulysses-in / Ulysses-out arithmetic as usp_attention applies
(usp.UspLayout); across the ring the patch's fresh K/V are gathered instead of
passed around, since every SP rank keeps the whole stale K/V.
The later patches' values are shifted by the mean change the patch measured in its own since the last
step (_shift_stale_values; off with --no-kv-drift-correction).
With `--fp8-stale-kv` the buffers are held in FP8 (quant/kv_buffer.py): a forward
decodes them, overwrites its own tokens with their fresh values and attends; only
what later forwards read goes through FP8.
"""
from __future__ import annotations

from contextlib import contextmanager

import torch

from ..distributed.comm import all_gather_uneven
from ..quant.kv_buffer import Fp8KVBuffer
from .usp import UspLayout, ulysses_in, ulysses_out


class StaleKV:
    """Full-sequence K/V per attention layer and guidance branch, refreshed patch by patch."""

    def __init__(self, state, fp8_format: torch.dtype | None = None) -> None:
        self.state = state  # the sequence hooks' state: patch window, stream lengths, SP groups, codecs
        self.fp8_format = fp8_format  # None: buffers in the working dtype; else Fp8KVBuffers of this format
        self._branch: str | None = None
        self.buffers: dict = {}  # (layer, branch) -> (K, V): [B, H/U, all streams' tokens, D] (tensors, or
        # Fp8KVBuffers of that shape), streams in order; other stale state kept per layer and branch (a RowHalo's
        # rows, linear attention's K.V summaries) under keys of its own, as tuples of tensors
        self.drift_correction = True
        """Whether the stale values are shifted by the drift the fresh patch measured (_shift_stale_values)."""
        self.keep = True
        """Whether whole-image forwards keep their K/V: only when a patch step will read them (the loop
        says), so warmup steps before the last one, and a run that is all warmup, hold no buffers."""

    def reset(self) -> None:
        self.buffers.clear()
        self.keep = True

    @property
    def branch(self) -> str | None:
        """The guidance branch whose forward runs now (state kept per branch is keyed by it)."""
        return self._branch

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
            # the ring ranks share the patch's fresh K/V (in SP rank order)
            k, v = (all_gather_uneven(t, 2, layout.run_lens, groups.ring_group) for t in (k, v))
        key = (active.module_name, self._branch)
        patch = state.patch
        whole = patch is None or patch[1] - patch[0] == state.full_lens[state.PATCHED_STREAM]
        if whole and state.sp_size == 1:
            # the whole sequence is fresh and already in buffer order: it becomes the buffer (no copy)
            if self.keep:
                self.buffers[key] = (self._hold(k), self._hold(v))
            keys, values = k, v
        else:
            keys, values = self._refresh(key, k, v, streams, lens, store=self.keep or not whole, whole=whole)
        out = state.local_attention(q, keys, values, scale)
        return ulysses_out(out, groups, layout, num_heads, state.codecs)

    def _refresh(self, key, k, v, streams, lens, store: bool, whole: bool):
        """Writes the fresh K/V (gathered [rank0: s1 s2 | rank1: s1 s2 | ...]) into their places in the
        buffers; returns the buffers (store=False: of this forward only, the whole sequence being fresh)."""
        state = self.state
        starts, total = {}, 0  # each stream's first token in the buffer
        for s in streams:
            starts[s], total = total, total + state.full_lens[s]
        shape = (*k.shape[:2], total, k.shape[-1])
        held = self.buffers.get(key) if store else None
        fresh_buffers = held is None  # nothing computed before: no drift to measure
        if held is None:
            if self.fp8_format is not None and store:
                held = self.buffers[key] = (Fp8KVBuffer.zeros(k, total, self.fp8_format),
                                            Fp8KVBuffer.zeros(v, total, self.fp8_format))
            else:
                held = (k.new_zeros(shape), v.new_zeros(shape))
                if store:
                    self.buffers[key] = held
        fp8 = isinstance(held[0], Fp8KVBuffer)
        if fp8:  # this forward's working-dtype copy: decoded, or (every token fresh) nothing to decode
            buf_k, buf_v = (k.new_empty(shape), v.new_empty(shape)) if whole else (held[0].read(), held[1].read())
        else:
            buf_k, buf_v = held
        patch = state.patch
        image_start, image_len = starts[state.PATCHED_STREAM], state.full_lens[state.PATCHED_STREAM]
        # the patch's values as last computed (the buffer keeps the patch's tokens together, in SP rank order),
        # where later patches are stale: not for the last patch
        shifts = self.drift_correction and not whole and not fresh_buffers and patch[1] < image_len
        last_values = buf_v.narrow(2, image_start + patch[0], patch[1] - patch[0]).clone() if shifts else None
        offset = 0
        for rank in range(state.sp_size):
            for s in streams:
                n = lens[s][rank]
                at = starts[s] + sum(lens[s][:rank]) + (patch[0] if patch is not None and s == state.PATCHED_STREAM
                                                        else 0)
                buf_k.narrow(2, at, n).copy_(k.narrow(2, offset, n))
                buf_v.narrow(2, at, n).copy_(v.narrow(2, offset, n))
                if fp8:
                    held[0].write(at, k.narrow(2, offset, n))
                    held[1].write(at, v.narrow(2, offset, n))
                offset += n
        if last_values is not None:
            _shift_stale_values(buf_v, last_values, image_start, patch, image_len)
        return buf_k, buf_v

    def _hold(self, t: torch.Tensor):
        """What a buffer keeps of a whole-sequence fresh K or V."""
        return _own(t) if self.fp8_format is None else Fp8KVBuffer.of(t, self.fp8_format)

    def held_bytes(self) -> int:
        """Bytes the buffers hold now (K and V of every layer and branch)."""
        return sum(t.nbytes for pair in self.buffers.values() for t in pair)


def _shift_stale_values(values: torch.Tensor, last: torch.Tensor, image_start: int, patch: tuple[int, int],
                        image_len: int) -> None:
    """Adds to the values of the later patches (still the last step's) the mean change the patch's own
    values saw since that step.

    values: [B, H, tokens, D], the patch's slice already fresh; last: [B, H, patch tokens, D], its values
    before. Part of what changes from step to step is shared by every token (the timestep's modulation
    shift, the image's overall drift), and a patch that has just been computed measures it. Values carry
    no position, so the mean change applies to any token; keys are rotated by position (RoPE) and
    RMS-normalised, so a mean key change means nothing for other positions and keys are left as they are.
    The earlier patches of this step are fresh and left alone. A working-dtype buffer is shifted in place,
    so the next patch measures its change against shifted values: either way (FP8 buffers shift only this
    forward's decoded copy) the later patches hold their last values plus the latest patch's drift, until
    their own turn overwrites them.
    """
    first, end = patch  # image tokens
    drift = (values.narrow(2, image_start + first, end - first) - last).mean(2, keepdim=True)  # [B, H, 1, D]
    values.narrow(2, image_start + end, image_len - end).add_(drift)


def _own(t: torch.Tensor) -> torch.Tensor:
    """t itself if it is all of its storage, else a copy (keeping a view would keep e.g. a fused QKV alive)."""
    if t.untyped_storage().nbytes() == t.numel() * t.element_size():
        return t
    return t.clone()
