"""Sequence parallelism (Ulysses, Ring, USP) applied to an unmodified diffusers transformer.

Hooks shard the plan's inputs across the SP ranks, mark each attention module
with the token streams its sequence holds, and gather the plan's outputs. Inside
a marked module, torch's scaled_dot_product_attention (which every diffusers
attention processor ends in) reaches this module's handlers through the SDPA router
(attention/router.py): USP attention, or PipeFusion's stale K/V; everywhere else it is
untouched. After every transformer forward the hooks check that each marked module that
ran did reach the router (the seam guard), else the run stops naming the module.
"""
from __future__ import annotations

import fnmatch
import inspect
from contextlib import contextmanager
from dataclasses import dataclass, field

import torch
from torch.distributed import ProcessGroup

from ..attention.kernels import attention_with_lse
from ..attention.router import TORCH_SDPA, install_sdpa_router, is_attention, route_during_forward, unreached
from ..attention.usp import EXACT, SequenceGroups, WireCodecs, usp_attention
from ..distributed.comm import all_gather_uneven, group_rank, group_size, split_sizes
from ..distributed.mesh import ParallelMesh
from ..errors import ConfigError
from ..mesh_axes import MeshAxis
from .plan import LOCAL, OUTPUT, KeyMask, MaskedTail, NotSdpa, SequencePlan, Split, TokenMask
from .row_halo import apply_row_halo


def sequence_groups(mesh: ParallelMesh) -> SequenceGroups:
    return SequenceGroups(
        ulysses_group=mesh.group(MeshAxis.ULYSSES), ulysses_size=mesh.size(MeshAxis.ULYSSES),
        ring_group=mesh.group(MeshAxis.RING), ring_size=mesh.size(MeshAxis.RING),
    )


@dataclass
class _SequenceState:
    groups: SequenceGroups
    sp_group: ProcessGroup
    sp_rank: int
    sp_size: int
    stream_lens: dict[str, list[int]] = field(default_factory=dict)
    """Per-SP-rank token counts of each stream, recorded when the stream is split."""
    full_lens: dict[str, int] = field(default_factory=dict)
    """Whole-image token count of each stream, before any patching (rows for a Split.rows stream)."""
    row_width: dict[str, int] = field(default_factory=dict)
    """Tokens per row of each Split.rows stream (its lengths are in rows)."""
    patch: tuple[int, int] | None = None
    """PipeFusion: the image tokens [start, stop) this forward computes (None: all of them)."""
    patch_windows: tuple[tuple[int, int], ...] = ()
    """PipeFusion: every patch's token window, in order (set by its loop; state kept per patch reads it)."""
    stale_kv: object = None
    """PipeFusion: the per-layer K/V buffers attention reads from (None: plain sequence parallelism)."""
    backend: object = None
    """The attention kernel (None: torch's SDPA); see meshdit.combine.fp8_runtime.Fp8AttentionBackend."""
    codecs: WireCodecs = EXACT
    """What encodes the sequence-parallel traffic (EXACT: nothing)."""
    tail_mask: tuple | None = None
    """MaskedTail: (the last key mask seen, (batch, head, tail), its kept tail lengths), reused while the same
    mask tensor comes back (every block of one forward)."""

    def local_attention(self, q, k, v, scale):
        if self.backend is None:
            return TORCH_SDPA(q, k, v, scale=scale)
        return self.backend.local(q, k, v, scale)

    @property
    def lse_attention(self):
        return attention_with_lse if self.backend is None else self.backend.with_lse

    PATCHED_STREAM = "img"

    @contextmanager
    def patch_window(self, start: int, stop: int | None):
        """PipeFusion: forwards inside compute the image tokens [start, stop) only (stop None: to the stream's end,
        which `split` resolves)."""
        self.patch = (start, stop)
        try:
            yield
        finally:
            self.patch = None

    def split(self, x: torch.Tensor, dim: int, stream: str, table: bool = False, rows: bool = False) -> torch.Tensor:
        if table and x.shape[dim] == 1:  # one row the model broadcasts over every token (Split.table)
            return x
        self.full_lens[stream] = x.shape[dim]
        if rows:  # Split.rows: dim holds token rows of x's [..., rows, columns] grid
            self.row_width[stream] = x.shape[-1]
        if self.patch is not None and stream == self.PATCHED_STREAM:
            if self.patch[1] is None:  # the last patch runs to the stream's end (tokens after the grid)
                self.patch = (self.patch[0], x.shape[dim] * self.row_width.get(stream, 1))
            start, stop = self.window(stream)
            x = x.narrow(dim, start, stop - start)
        self.stream_lens[stream] = split_sizes(x.shape[dim], self.sp_size)
        return x.tensor_split(self.sp_size, dim=dim)[self.sp_rank]

    def gather(self, x: torch.Tensor, dim: int, stream: str) -> torch.Tensor:
        x = all_gather_uneven(x, dim, self.lens(stream), self.sp_group)
        if self.patch is not None and stream == self.PATCHED_STREAM:
            # the model's own unpatchify needs every token: the patch goes into zeros
            start, stop = self.window(stream)
            shape = list(x.shape)
            shape[dim] = self.full_lens[stream]
            full = x.new_zeros(shape)
            full.narrow(dim, start, stop - start).copy_(x)
            x = full
        return x

    def window(self, stream: str) -> tuple[int, int]:
        """The PipeFusion patch window in the stream's units: tokens, or rows for a Split.rows stream."""
        start, stop = self.patch
        width = self.row_width.get(stream)
        return (start, stop) if width is None else (start // width, stop // width)

    def token_lens(self, stream: str) -> list[int]:
        """Per-SP-rank token counts of `stream` (its lens, times the row width for a Split.rows stream)."""
        width = self.row_width.get(stream, 1)
        return [n * width for n in self.lens(stream)]

    def lens(self, stream: str) -> list[int]:
        if stream not in self.stream_lens:
            raise RuntimeError(f"sequence-parallel plan error: stream {stream!r} was never split")
        return self.stream_lens[stream]


@dataclass
class _ActiveAttention:
    state: _SequenceState
    streams: tuple[str, ...]
    module_name: str

    def __call__(self, query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None,
                 enable_gqa=False):
        if attn_mask is not None or dropout_p or is_causal or enable_gqa:
            raise NotImplementedError(
                f"{self.module_name}: sequence parallelism supports unmasked, non-causal attention "
                "without dropout or grouped K/V; run this model with ulysses/ring degree 1."
            )
        per_rank = [sum(lens) for lens in zip(*(self.state.lens(s) for s in self.streams))]
        if query.shape[-2] != per_rank[self.state.sp_rank] or key.shape[-2] != query.shape[-2]:
            raise RuntimeError(
                f"{self.module_name}: expected {per_rank[self.state.sp_rank]} local tokens of streams "
                f"{self.streams}, got q {tuple(query.shape)} k {tuple(key.shape)}: the model plan is wrong"
            )
        if self.state.stale_kv is not None:
            return self.state.stale_kv.attention(self, query, key, value, scale)
        state = self.state
        return usp_attention(query, key, value, state.groups, per_rank, scale, state.local_attention,
                             state.lse_attention, state.codecs)


@dataclass
class _KeyMaskAttention:
    """Attention over split `streams` whose SDPA mask, when given, is a boolean key mask over their whole tokens
    (KeyMask): unmasked calls are the plain sequence-parallel attention; a masked call gathers every stream's K/V
    over the SP ranks (whole streams, in the streams' order) and attends this rank's queries under the whole mask."""

    state: _SequenceState
    streams: tuple[str, ...]
    module_name: str

    def __call__(self, query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None,
                 enable_gqa=False):
        active = _ActiveAttention(self.state, self.streams, self.module_name)
        if attn_mask is None:
            return active(query, key, value, dropout_p=dropout_p, is_causal=is_causal, scale=scale,
                          enable_gqa=enable_gqa)
        state = self.state
        whole = sum(state.full_lens[s] for s in self.streams)
        if attn_mask.dtype != torch.bool or attn_mask.dim() != 4 or attn_mask.shape[1:3] != (1, 1) \
                or attn_mask.shape[-1] != whole:
            raise NotImplementedError(f"{self.module_name}: sequence parallelism takes a boolean key mask "
                                      f"[B, 1, 1, {whole}] here, got {attn_mask.dtype} {tuple(attn_mask.shape)}")
        if dropout_p or is_causal or enable_gqa or state.stale_kv is not None:
            raise NotImplementedError(f"{self.module_name}: a masked call runs under Ulysses / Ring only, without "
                                      "dropout, causal masking, grouped K/V or PipeFusion; run this batch with "
                                      "--pipefusion-parallel-degree 1 (or prompts of one length)")
        local = [state.lens(s)[state.sp_rank] for s in self.streams]

        def whole_streams(x):  # [B, H, local, D] -> [B, H, N, D], each stream gathered in its place
            parts = x.split(local, dim=2)
            return torch.cat([all_gather_uneven(p.contiguous(), 2, state.lens(s), state.sp_group)
                              for p, s in zip(parts, self.streams)], dim=2)

        return TORCH_SDPA(query, whole_streams(key), whole_streams(value), attn_mask=attn_mask, scale=scale)


@dataclass
class _MaskedTailAttention:
    """Attention over split `streams` followed by a whole `tail` whose padding a key mask hides (MaskedTail).

    The kept tail tokens (a prefix: the mask must keep all split tokens and a run of tail tokens from its
    start) are dealt out over the SP ranks like a split stream, so the plain sequence-parallel attention (USP,
    or PipeFusion's stale K/V) runs without a mask; the tail's outputs are gathered back onto every rank."""

    state: _SequenceState
    plan: MaskedTail
    module_name: str

    def __call__(self, query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None,
                 enable_gqa=False):
        if dropout_p or is_causal or enable_gqa:
            raise NotImplementedError(f"{self.module_name}: sequence parallelism supports non-causal attention "
                                      "without dropout or grouped K/V; run this model with ulysses/ring degree 1.")
        state = self.state
        head = sum(state.lens(s)[state.sp_rank] for s in self.plan.streams)  # this rank's split tokens
        if self.plan.leading:  # [tail, streams] -> [streams, tail], and the output back
            lead = query.shape[-2] - head
            query, key, value = (x.roll(-lead, dims=2) for x in (query, key, value))
            if attn_mask is not None:
                attn_mask = attn_mask.roll(-lead, dims=-1)
                if attn_mask.shape[-2] > 1:  # a query x key mask: its rows too
                    attn_mask = attn_mask.roll(-lead, dims=-2)
            return self._attend(query, key, value, attn_mask, scale, head).roll(lead, dims=2)
        return self._attend(query, key, value, attn_mask, scale, head)

    def _attend(self, query, key, value, attn_mask, scale, head: int):
        state = self.state
        kept = self._kept(attn_mask, query.shape[0], head, query.shape[-2] - head)  # [B] tail tokens kept
        out = query.new_zeros(query.shape)  # [B, H, head + tail, D]; masked tail positions stay 0
        runs = [(b, b + 1) for b in range(len(kept))] if len(set(kept)) > 1 else [(0, len(kept))]
        for b0, b1 in runs:  # samples with different kept lengths attend one by one (PipeFusion: own buffers)
            name = self.module_name if len(runs) == 1 else f"{self.module_name}#{b0}"
            n = kept[b0]
            sizes = split_sizes(n, state.sp_size)  # the kept tail, dealt out like a split stream
            t0 = head + sum(sizes[:state.sp_rank])
            local = [torch.cat([x[b0:b1, :, :head], x[b0:b1, :, t0:t0 + sizes[state.sp_rank]]], dim=2)
                     for x in (query, key, value)]
            state.stream_lens[self.plan.tail], state.full_lens[self.plan.tail] = sizes, n
            part = _ActiveAttention(state, (*self.plan.streams, self.plan.tail), name)(*local, scale=scale)
            out[b0:b1, :, :head] = part[:, :, :head]
            out[b0:b1, :, head:head + n] = all_gather_uneven(part[:, :, head:].contiguous(), 2, sizes,
                                                             state.sp_group)
        return out

    def _kept(self, mask, batch: int, head: int, tail: int) -> list[int]:
        """Tail tokens the boolean mask keeps, per sample: a key mask [B or 1, 1, 1, head + tail], or a query x
        key mask [B or 1, 1, head + tail, head + tail] that is one (every row equal) or hides padding from both
        sides (HunyuanVideo 1.5: row i is the key mask where token i is kept, else all False; SDPA gives such a
        row 0, as the dropped token's output here).

        A key mask costs one host sync per mask tensor (the model passes the same one to every block of a
        forward); a query x key mask, which the processor rebuilds in every block, one check and sync per call."""
        if mask is None:
            return [tail] * batch
        cached = self.state.tail_mask
        if cached is not None and cached[0] is mask and cached[1] == (batch, head, tail):
            return cached[2]
        n = head + tail
        if mask.dtype != torch.bool or mask.dim() != 4 or mask.shape[1] != 1 or mask.shape[2] not in (1, n) \
                or mask.shape[-1] != n:
            raise NotImplementedError(f"{self.module_name}: sequence parallelism takes a boolean key mask "
                                      f"[B, 1, 1, {n}] or query x key mask [B, 1, {n}, {n}] here, got {mask.dtype} "
                                      f"{tuple(mask.shape)}")
        keys = mask[:, 0].any(dim=-2)  # [B, N]: the keys some query sees
        if mask.shape[2] > 1:
            queries = mask[:, 0].any(dim=-1)  # [B, N]: the queries that see some key
            key_only = bool(queries.all()) and torch.equal(mask[:, 0], keys[:, None, :].expand(-1, n, -1))
            if not key_only and not (torch.equal(queries, keys)
                                     and torch.equal(mask[:, 0], queries[:, :, None] & keys[:, None, :])):
                raise NotImplementedError(f"{self.module_name}: sequence parallelism takes a query x key mask only "
                                          "as a key mask (every row equal) or one token mask applied to queries and "
                                          "keys alike; run this model with ulysses/ring degree 1.")
        keys = keys.expand(batch, n).cpu()
        kept = keys[:, head:].sum(dim=1)
        prefix = torch.arange(tail) < kept[:, None]  # [B, tail]: the mask must keep a prefix of the tail
        if not keys[:, :head].all() or not torch.equal(keys[:, head:], prefix):
            raise NotImplementedError(f"{self.module_name}: the key mask must keep every split token and a prefix "
                                      f"of the {self.plan.tail!r} tokens (padding at the end)")
        self.state.tail_mask = (mask, (batch, head, tail), kept.tolist())
        return self.state.tail_mask[2]


@dataclass
class _TokenMaskAttention:
    """Attention over split `streams` whose SDPA mask is a float token mask applied to queries and keys alike,
    `m_i * m_j` (TokenMask): the bias rides in one extra channel of q and k, so the plain sequence-parallel
    attention runs without a mask and scores exactly what one process's masked SDPA scores."""

    state: _SequenceState
    plan: TokenMask
    module_name: str

    EXTRA = 8
    """Channels added per head (one carries the mask; 8 keep the head size's multiple of 8 for GPU kernels)."""

    def __call__(self, query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None,
                 enable_gqa=False):
        active = _ActiveAttention(self.state, self.plan.streams, self.module_name)
        if attn_mask is None:
            return active(query, key, value, dropout_p=dropout_p, is_causal=is_causal, scale=scale,
                          enable_gqa=enable_gqa)
        scale = query.shape[-1] ** -0.5 if scale is None else scale
        mask = self._local_mask(attn_mask, query.shape[0]).to(query.dtype)[:, None, :, None]  # [B, 1, n, 1]
        pad = [0, self.EXTRA]

        def widen(x, channel):  # [B, H, n, D] -> [B, H, n, D + EXTRA], channel 0 of the extra ones set
            wide = torch.nn.functional.pad(x, pad)
            if channel is not None:
                wide[..., x.shape[-1]] = channel.expand(x.shape[:-1])
            return wide

        out = active(widen(query, mask[..., 0] / scale), widen(key, mask[..., 0]), widen(value, None),
                     dropout_p=dropout_p, is_causal=is_causal, scale=scale, enable_gqa=enable_gqa)
        return out[..., :query.shape[-1]]

    def _local_mask(self, mask, batch: int) -> torch.Tensor:
        """This rank's tokens' m [B, n], from the whole query x key mask [B or 1, 1, N, N], which must be the
        outer product of one 0/1 token mask (checked on every call: the processor rebuilds it in every block)."""
        state = self.state
        n = sum(state.full_lens[s] for s in self.plan.streams)
        if mask.dtype == torch.bool or mask.dim() != 4 or mask.shape[1] != 1 or mask.shape[-2:] != (n, n):
            raise NotImplementedError(f"{self.module_name}: sequence parallelism takes a float query x key mask "
                                      f"[B, 1, {n}, {n}] here, got {mask.dtype} {tuple(mask.shape)}; run this model "
                                      "with ulysses/ring/pipefusion degree 1.")
        tokens = mask[:, 0].diagonal(dim1=-2, dim2=-1)  # [B, N]: m_i * m_i = m_i
        if not bool(((tokens == 0) | (tokens == 1)).all()) or not torch.equal(
                mask[:, 0], tokens[:, :, None] * tokens[:, None, :]):
            raise NotImplementedError(f"{self.module_name}: sequence parallelism takes a query x key mask only as "
                                      "one 0/1 token mask applied to queries and keys alike; run this model with "
                                      "ulysses/ring/pipefusion degree 1.")
        parts, offset = [], 0
        for stream in self.plan.streams:  # the local shard of each stream, at its place in the whole sequence
            start = offset + sum(state.lens(stream)[:state.sp_rank])
            if state.patch is not None and stream == state.PATCHED_STREAM:
                start += state.patch[0]
            parts.append(tokens[:, start:start + state.lens(stream)[state.sp_rank]])
            offset += state.full_lens[stream]
        return torch.cat(parts, dim=1).expand(batch, -1)


def _named_inputs(module, args, kwargs):
    # a PipeFusion stand-in (SkipBlock) states the signature of the block it replaced
    signature = getattr(module, "signature", None) or inspect.signature(module.forward)
    bound = signature.bind_partial(*args, **kwargs)
    return dict(bound.arguments)


def apply_sequence_parallel(transformers: torch.nn.Module | list[torch.nn.Module], plan: SequencePlan,
                            mesh: ParallelMesh, backend=None,
                            codecs: WireCodecs = EXACT) -> tuple[_SequenceState, list]:
    """Hooks `plan` into `transformers` (one, or a pipeline's experts: Wan 2.2); returns (the hooks' state,
    the hook handles: remove() undoes it).

    The hooks also serve PipeFusion, which cuts the image stream into patches through
    the state (`patch_window`) and reads stale K/V through it (`stale_kv`).
    `backend` (None: SDPA) computes attention, `codecs` encode what travels.
    Experts share the state (one runs at a time); their attention modules are named apart ("1:blocks.0.attn1").
    """
    sp_group = mesh.group(MeshAxis.SP)
    state = _SequenceState(sequence_groups(mesh), sp_group, group_rank(sp_group), group_size(sp_group),
                           backend=backend, codecs=codecs)
    handles = [install_sdpa_router()]
    many = isinstance(transformers, (list, tuple))
    for index, transformer in enumerate(transformers if many else [transformers]):
        handles += _hook_transformer(transformer, plan, state, f"{index}:" if many and index else "")
    return state, handles


def _split(state: _SequenceState, x: torch.Tensor, split: Split) -> torch.Tensor:
    if split.expected_dims is not None and x.dim() != split.expected_dims:  # no tokens in this form
        return x
    if split.band_tokens:  # the tokens of the row bands the stream was split into
        if state.patch is not None:
            raise NotImplementedError(f"{split.arg}: a per-token input beside a rows stream is not patched for "
                                      "PipeFusion; run it with pipefusion degree 1")
        return x.split(state.token_lens(split.stream), dim=split.dim)[state.sp_rank]
    return state.split(x, split.dim, split.stream, split.table, split.rows)


def _hook_transformer(transformer: torch.nn.Module, plan: SequencePlan, state: _SequenceState,
                      prefix: str) -> list:
    modules = dict(transformer.named_modules())
    handles = []

    for split in plan.splits:
        for module in _find_all(modules, split.module):  # a glob hooks every block it matches
            if split.arg == OUTPUT:
                def split_output(_mod, _args, out, split=split):
                    if isinstance(out, (tuple, list)):  # e.g. Wan's rope returns (cos, sin), each [1, S, 1, D]
                        return _split_items(out, split, state)
                    return _split(state, out, split)
                handles.append(module.register_forward_hook(split_output))
            else:
                def split_input(mod, args, kwargs, split=split):
                    named = _named_inputs(mod, args, kwargs)
                    value = named.get(split.arg)
                    if isinstance(value, (tuple, list)):  # e.g. HunyuanDiT's rotary (cos, sin), each [S, D]
                        named[split.arg] = _split_items(value, split, state)
                    elif value is not None:
                        named[split.arg] = _split(state, value, split)
                    return (), named
                handles.append(module.register_forward_pre_hook(split_input, with_kwargs=True))

    for gather in plan.gathers:
        def gather_output(_mod, _args, out, gather=gather):
            if isinstance(out, torch.Tensor):
                return state.gather(out, gather.dim, gather.stream)
            if isinstance(out, tuple):  # the transformer's own output (return_dict=False): its first tensor
                return (state.gather(out[0], gather.dim, gather.stream), *out[1:])
            out.sample = state.gather(out.sample, gather.dim, gather.stream)  # a diffusers ModelOutput
            return out
        handles.append(_find(modules, gather.module).register_forward_hook(gather_output))

    marked = {}  # id(handler) -> attention module, of the modules that must reach the router
    for name, module in modules.items():
        if not is_attention(module):
            continue
        streams = _match(plan.attention, name)
        if streams == LOCAL:
            continue
        if isinstance(streams, NotSdpa):  # made sequence-parallel by its own exchange; SDPA would be wrong there
            refusal = _SdpaNotExpected(prefix + name)
            marked[id(refusal)] = module  # guarded: its exchange must note that it ran (router.note_exchanged)
            handles += route_during_forward(module, refusal)
            handles += streams.exchange(module, state, prefix + name, streams.streams)
            continue
        if isinstance(streams, MaskedTail):
            active = _MaskedTailAttention(state, streams, prefix + name)
        elif isinstance(streams, TokenMask):
            active = _TokenMaskAttention(state, streams, prefix + name)
        elif isinstance(streams, KeyMask):
            active = _KeyMaskAttention(state, tuple(streams.streams), prefix + name)
        else:
            active = _ActiveAttention(state, tuple(streams), prefix + name)
        marked[id(active)] = module
        handles += route_during_forward(module, active)
    for halo in plan.halos:
        handles += apply_row_halo(modules, halo, state, prefix)
    return handles + _guard_attention_seam(transformer, marked)


def _split_items(values: tuple | list, split, state: _SequenceState):
    """A tuple or list's tensors split alike, or only its `split.item` (the others kept whole)."""
    return type(values)(_split(state, v, split) if split.item is None or i == split.item else v
                        for i, v in enumerate(values))


def _guard_attention_seam(transformer: torch.nn.Module, marked: dict) -> list:
    """Hooks that stop the run after a forward in which a marked attention module ran without its attention
    reaching the router: its processor attends some other way (explicit matmuls, linear attention), over this
    rank's shard only."""

    def forget(_mod, _args):
        unreached()  # marked modules run outside a forward (a block called alone) are not this forward's

    def check(_mod, _args, _out):
        missing = unreached()
        bypassed = [h for h in missing if isinstance(h, _SdpaNotExpected)]
        if bypassed:
            names = "; ".join(f"{h.module_name} ({type(marked[id(h)].processor).__name__})" for h in bypassed)
            raise ConfigError(
                f"attention module {names} ran without its sequence-parallel exchange (the plan marks it NotSdpa), "
                "so it attended over this rank's tokens only: give it the processor its exchange is written for, "
                "or run with --ulysses-degree, --ring-degree and --pipefusion-parallel-degree 1.")
        if missing:
            names = "; ".join(f"{h.module_name} ({type(marked[id(h)].processor).__name__})" if id(h) in marked
                              else h.module_name for h in missing)
            raise ConfigError(
                f"attention module {names} ran without calling torch's scaled_dot_product_attention, so under "
                "sequence parallelism or PipeFusion it attended over this rank's tokens only. Give it a processor "
                "that calls SDPA, mark it NotSdpa in the family's plan with an exchange that makes it "
                "sequence-parallel (parallel/plan.py), or run with --ulysses-degree, --ring-degree and "
                "--pipefusion-parallel-degree 1.")

    return [transformer.register_forward_pre_hook(forget), transformer.register_forward_hook(check)]


@dataclass
class _SdpaNotExpected:
    """The router's handler for a NotSdpa module: its plan says it attends without SDPA, so a call is an error."""

    module_name: str

    def __call__(self, *args, **kwargs):
        raise ConfigError(
            f"attention module {self.module_name} called torch's scaled_dot_product_attention, but the plan marks "
            "it NotSdpa (made sequence-parallel by its own exchange), so the call would attend over this rank's "
            "tokens only: mark it with the streams it attends over instead, or give it the processor its "
            "exchange is written for.")


def _find(modules: dict, path: str) -> torch.nn.Module:
    if path not in modules:
        raise RuntimeError(f"sequence-parallel plan names module {path!r}, which this transformer lacks")
    return modules[path]


def _find_all(modules: dict, path: str) -> list[torch.nn.Module]:
    """The module at `path`, or every module a glob matches at its depth ("layers.*": the blocks, not their parts)."""
    if not any(c in path for c in "*?["):
        return [_find(modules, path)]
    found = [m for name, m in modules.items() if name.count(".") == path.count(".") and fnmatch.fnmatchcase(name, path)]
    if not found:
        raise RuntimeError(f"sequence-parallel plan names modules {path!r}, which this transformer lacks")
    return found


def _match(attention: dict, name: str):
    for pattern, streams in attention.items():
        if fnmatch.fnmatchcase(name, pattern):
            return streams
    raise RuntimeError(f"sequence-parallel plan does not say which tokens attention module {name!r} sees")
