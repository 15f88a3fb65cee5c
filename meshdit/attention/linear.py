"""Linear attention made sequence-parallel by exchanging its K.V summary (SANA; plan word NotSdpa).

diffusers' SanaLinearAttnProcessor2_0 computes, per head, with phi = ReLU and no softmax (so no SDPA call):

    out_i = phi(q_i) . S / (phi(q_i) . z),   S = sum_j phi(k_j)^T v_j [D, D],   z = sum_j phi(k_j) [D]

(it pads V with a row of ones, so S and z are one matmul: [V; 1] phi(K) -> [D + 1, D]). Every query needs only the
summary, a sum over tokens, never another rank's keys or values. The summary lives inside the processor's
matmuls, where no seam reaches, so the exchange installs `SummaryExchangingLinearAttention`, the same arithmetic
in the same precision (float32 after ReLU) with the summary taken over the whole sequence:

- Ulysses: q, k, v cross one all-to-all to (the whole run of the Ulysses group, a share of the heads), as for
  SDPA attention (usp.ulysses_in / ulysses_out); the summary is then whole for those heads.
- Ring: the per-rank summaries [B, H, D + 1, D] are summed over the ring group (one all-reduce, float64, so
  every rank gets the same correctly rounded float32 sum whatever the reduction order); K/V never travel.
- USP (Ulysses x Ring) composes the two.
- PipeFusion: each patch's contribution to the summary is kept per layer and guidance branch (its stale K/V),
  the fresh patch's replaced on every forward; a kept whole-image step stores every patch's share. With full
  warmup nothing is kept and the whole-image summary is used as is (exact).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from ..distributed.comm import all_reduce, group_rank
from ..errors import ConfigError
from .router import note_exchanged
from .usp import UspLayout, ulysses_in, ulysses_out

KIND = "linear_attention_summary"
"""comm_stats kind of the summaries' all-reduce."""

PROCESSORS = ("SanaLinearAttnProcessor2_0",)
"""The diffusers processors whose arithmetic SummaryExchangingLinearAttention repeats."""


def exchange_kv_summary(module, state, path: str, streams: tuple[str, ...]) -> list:
    """NotSdpa exchange: `module` computes its linear attention over every SP rank's tokens of `streams`.
    Returns a handle whose remove() gives the module its own processor back."""
    original = module.processor
    if type(original).__name__ not in PROCESSORS:
        raise ConfigError(f"{path}: its processor {type(original).__name__} is not the linear attention meshdit "
                          f"makes sequence-parallel ({', '.join(PROCESSORS)}); run with --ulysses-degree, "
                          "--ring-degree and --pipefusion-parallel-degree 1.")
    module.set_processor(SummaryExchangingLinearAttention(state, path, tuple(streams)))
    return [_RestoreProcessor(module, original)]


@dataclass
class _RestoreProcessor:
    module: torch.nn.Module
    original: object

    def remove(self) -> None:
        self.module.set_processor(self.original)


@dataclass
class SummaryExchangingLinearAttention:
    """SanaLinearAttnProcessor2_0 over the whole sequence from this rank's tokens (module docstring)."""

    state: object  # parallel.sequence._SequenceState
    name: str
    streams: tuple[str, ...]

    @torch.compiler.disable  # collectives inside
    def __call__(self, attn, hidden_states, encoder_hidden_states=None, attention_mask=None):
        note_exchanged()
        if encoder_hidden_states is not None or attention_mask is not None:
            raise NotImplementedError(f"{self.name}: sequence-parallel linear attention is self-attention without "
                                      "a mask")
        state, dtype, heads = self.state, hidden_states.dtype, attn.heads
        query, key, value = attn.to_q(hidden_states), attn.to_k(hidden_states), attn.to_v(hidden_states)
        if attn.norm_q is not None:
            query = attn.norm_q(query)
        if attn.norm_k is not None:
            key = attn.norm_k(key)
        q, k, v = (t.unflatten(-1, (heads, -1)).transpose(1, 2) for t in (query, key, value))  # [B, H, S_me, D]
        per_rank = [sum(lens) for lens in zip(*(state.token_lens(s) for s in self.streams))]
        layout = UspLayout.of(state.groups, per_rank)
        q, k, v = ulysses_in(q, k, v, state.groups, layout, state.codecs)  # [B, H/U, run, D]
        q = F.relu(q).float().transpose(-1, -2)  # [B, h, D, run]
        k = F.relu(k).float()  # [B, h, run, D]
        v = F.pad(v.float().transpose(-1, -2), (0, 0, 0, 1), value=1.0)  # [B, h, D + 1, run]: z's row of ones
        out = self._summary(v, k, layout) @ q  # [B, h, D + 1, run]
        out = (out[:, :, :-1] / (out[:, :, -1:] + 1e-15)).transpose(-1, -2).to(dtype)  # [B, h, run, D]
        out = ulysses_out(out, state.groups, layout, heads, state.codecs)  # [B, H, S_me, D]
        out = attn.to_out[1](attn.to_out[0](out.transpose(1, 2).flatten(2)))  # [B, S_me, H * D]
        return out.clip(-65504, 65504) if dtype == torch.float16 else out

    def _summary(self, v, k, layout: UspLayout) -> torch.Tensor:
        """[V; 1] phi(K) over every token: [B, h, D + 1, D] (v: [B, h, D + 1, run], k: [B, h, run, D])."""
        stale = self.state.stale_kv
        if stale is None:
            return self._ring_sum(v @ k)
        return self._stale_summary(v, k, layout, stale)

    def _ring_sum(self, x: torch.Tensor) -> torch.Tensor:
        groups = self.state.groups
        if groups.ring_size == 1:
            return x
        return all_reduce(x.double(), groups.ring_group, KIND).float()

    def _stale_summary(self, v, k, layout: UspLayout, stale) -> torch.Tensor:
        """PipeFusion: the summary from every patch's share as last computed, this forward's fresh."""
        state = self.state
        (stream,) = self.streams
        full = state.full_lens[stream] * state.row_width.get(stream, 1)  # tokens of the whole image
        start, stop = state.patch or (0, full)
        whole = stop - start == full
        if whole and not stale.keep:  # no patch step reads it: the plain summary
            return self._ring_sum(v @ k)
        key = ("summary", self.name, stale.branch)
        ring_me = group_rank(state.groups.ring_group) if state.groups.ring_size > 1 else 0
        run0 = start + sum(layout.run_lens[:ring_me])  # this run's first token in the image
        if whole:  # every patch's share of this run, summed over the ring: [P, B, h, D + 1, D]
            shares = []
            for w0, w1 in state.patch_windows:
                a, b = max(w0 - run0, 0), min(w1 - run0, v.shape[-1])
                shares.append(v[..., a:b] @ k[..., a:b, :] if b > a else v.new_zeros(*v.shape[:-1], k.shape[-1]))
            per_patch = self._ring_sum(torch.stack(shares))
        else:
            held = stale.buffers.get(key)
            if held is None:
                raise RuntimeError(f"{self.name}: a patch ran before any whole-image step kept its summary")
            per_patch = held[0]
            per_patch[state.patch_windows.index((start, stop))] = self._ring_sum(v @ k)
        stale.buffers[key] = (per_patch,)
        return per_patch.sum(0)
