"""PipeFusion: the transformer's blocks split into stages over the pp axis, the image into patches.

Each rank keeps only its stage's blocks (the others become SkipBlocks that pass
activations through) and runs the unmodified model forward for one patch at a
time; hooks at the stage boundaries receive the previous stage's activations and
send this stage's on. Every attention layer keeps a full-sequence K/V buffer per
guidance branch: a patch refreshes its own slice and attends to the rest as last
computed (this step for earlier patches, the previous step for later ones).
Sends are posted without waiting (isend), so gloo's blocking sends cannot
deadlock the cycle in which the last stage hands stepped latents back to stage 0.
"""
from __future__ import annotations

import inspect

import torch
import torch.distributed as dist
from torch import nn

from ..attention.ulysses import heads_to_seq, seq_to_heads
from ..distributed.comm import all_gather_uneven, isend_tensor, recv_tensor
from ..distributed.mesh import ParallelMesh
from ..distributed.timeline import timeline
from .plan import BlockList, PipelinePlan


class SkipBlock(nn.Module):
    """Stands in for a block that another stage holds: returns the carried activations unchanged."""

    def __init__(self, spec: BlockList, signature: inspect.Signature) -> None:
        super().__init__()
        self.spec = spec
        self.signature = signature

    def forward(self, *args, **kwargs):
        named = self.signature.bind_partial(*args, **kwargs).arguments
        if isinstance(self.spec.returns, str):
            return named[self.spec.returns]
        return tuple(named[name] for name in self.spec.returns)


class StaleKV:
    """Full-sequence K/V per attention layer and guidance branch, refreshed patch by patch."""

    def __init__(self, state) -> None:
        self.state = state  # the sequence hooks' state: patch, stream lengths, SP groups
        self.branch: str | None = None
        self.buffers: dict = {}

    def reset(self) -> None:
        self.buffers.clear()

    def attention(self, active, q, k, v, scale):
        """q, k, v: [B, H, S_local, D] for this rank's tokens of the patch -> [B, H, S_local, D]."""
        state = self.state
        codecs = state.codecs
        streams = active.streams
        lens = {s: state.lens(s) for s in streams}  # per SP rank
        per_rank = [sum(lens[s][r] for s in streams) for r in range(state.sp_size)]
        num_heads = q.shape[1]
        groups = state.groups
        u = groups.ulysses_size
        ulysses = groups.ulysses_group if u > 1 else None
        ring_me = dist.get_rank(groups.ring_group) if groups.ring_size > 1 else 0
        members = per_rank[ring_me * u:(ring_me + 1) * u]  # SP ranks of my Ulysses group
        if ulysses is not None:  # my group's tokens for a head shard
            q, k, v = (seq_to_heads(t, ulysses, members, c) for t, c in ((q, codecs.q), (k, codecs.k), (v, codecs.v)))
        if groups.ring_size > 1:
            # Every SP rank keeps the whole stale K/V: the ring ranks share the patch's fresh
            # K/V (in SP rank order, as _by_stream expects); queries stay local.
            runs = [sum(per_rank[g * u:(g + 1) * u]) for g in range(groups.ring_size)]
            k, v = (all_gather_uneven(t, 2, runs, groups.ring_group) for t in (k, v))
        buffers = self.buffers.setdefault((active.module_name, self.branch), {})
        keys, values = [], []
        for stream, (fresh_k, fresh_v) in _by_stream(k, v, streams, lens).items():
            start = state.patch[0] if state.patch is not None and stream == state.PATCHED_STREAM else 0
            if stream not in buffers:
                shape = (*fresh_k.shape[:2], state.full_lens[stream], fresh_k.shape[-1])
                buffers[stream] = (fresh_k.new_zeros(shape), fresh_v.new_zeros(shape))
            buf_k, buf_v = buffers[stream]  # [B, H/U, S_stream, D]
            buf_k.narrow(2, start, fresh_k.shape[2]).copy_(fresh_k)
            buf_v.narrow(2, start, fresh_v.shape[2]).copy_(fresh_v)
            keys.append(buf_k)
            values.append(buf_v)
        out = state.local_attention(q, torch.cat(keys, dim=2), torch.cat(values, dim=2), scale)
        if ulysses is not None:
            out = heads_to_seq(out, ulysses, members, num_heads, codecs.out)
        return out


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


class PipeFusion:
    """This rank's stage of the transformer, and the p2p traffic between stages."""

    def __init__(self, transformer: nn.Module, plan: PipelinePlan, mesh: ParallelMesh, seq_state,
                 codec_for=None) -> None:
        self.group = mesh.group("pp")
        self.codec_for = codec_for or (lambda tensor: None)  # tensor -> its wire codec (None: exact)
        self.stage = mesh.local_rank("pp")
        self.num_stages = mesh.size("pp")
        self.ranks = dist.get_process_group_ranks(self.group)  # global rank of each stage
        self.stale_kv = StaleKV(seq_state)
        seq_state.stale_kv = self.stale_kv
        self._pending: list = []  # (work, tensor) of sends in flight
        self.handles = []
        modules = dict(transformer.named_modules())
        blocks = [(modules[spec.path], i, spec) for spec in plan.blocks for i in range(len(modules[spec.path]))]
        sizes = balanced_stages([block_weight(b[0][b[1]]) for b in blocks], self.num_stages)
        starts = [sum(sizes[:s]) for s in range(self.num_stages)]
        mine = range(starts[self.stage], starts[self.stage] + sizes[self.stage])
        for index, (block_list, i, spec) in enumerate(blocks):
            if index not in mine:  # free the weights of other stages' blocks
                block_list[i] = SkipBlock(spec, inspect.signature(block_list[i].forward))
        if self.stage > 0:
            block_list, i, spec = blocks[starts[self.stage]]
            self.handles.append(block_list[i].register_forward_pre_hook(self._receive_hook(spec), with_kwargs=True))
        if self.stage < self.num_stages - 1:
            block_list, i, spec = blocks[starts[self.stage + 1]]
            self.handles.append(block_list[i].register_forward_pre_hook(self._send_hook(spec), with_kwargs=True))

    @property
    def is_first(self) -> bool:
        return self.stage == 0

    @property
    def is_last(self) -> bool:
        return self.stage == self.num_stages - 1

    # NOTE: stage s sends to s+1 exactly the tensors s+1 receives, in the same
    # order, once per forward; every rank runs the same sequence of forwards.
    # Under --compile the stage hooks run eagerly (compiler.disable): their p2p cannot be traced.
    def _receive_hook(self, spec: BlockList):
        @torch.compiler.disable
        def hook(module, args, kwargs):
            named = _named(module, args, kwargs)
            for name in spec.carry:
                mine = named[name]
                named[name] = self.recv(mine, self.stage - 1)
            return (), named
        return hook

    def _send_hook(self, spec: BlockList):
        @torch.compiler.disable
        def hook(module, args, kwargs):
            named = _named(module, args, kwargs)
            for name in spec.carry:
                self.send(named[name], self.stage + 1)
        return hook

    def send(self, tensor: torch.Tensor, stage: int) -> None:
        # a private copy (or its codec bytes) travels: the caller may reuse its buffer
        self._pending.append(isend_tensor(tensor, self.ranks[stage], self.group, self.codec_for(tensor)))
        self._pending = [(w, t) for w, t in self._pending if not w.is_completed()]

    def recv(self, like: torch.Tensor, stage: int) -> torch.Tensor:
        """Receives a tensor of `like`'s shape and dtype from `stage`."""
        return recv_tensor(like.shape, like.dtype, like.device, self.ranks[stage], self.group, self.codec_for(like))

    def send_latents(self, new: torch.Tensor, old: torch.Tensor, stage: int) -> None:
        """Hands a stepped latent region back to `stage`, which holds `old` for it.

        With a codec only the update new - old travels (its quantization error is a
        fraction of the step, not of the latents), and `new` becomes exactly what the
        receiver reconstructs, so the stages never drift apart.
        """
        codec = self.codec_for(new)
        if codec is None:
            self.send(new, stage)
            return
        update = new - old
        self.send(update, stage)
        new.copy_(old + codec.decode(codec.encode(update), update.shape, update.dtype))

    def recv_latents(self, view: torch.Tensor, stage: int) -> None:
        """Receives what send_latents sent into `view` (which holds the old values)."""
        received = self.recv(view, stage)
        if self.codec_for(view) is None:
            view.copy_(received)
        else:
            view.copy_(view + received)

    def finish(self) -> None:
        with timeline.span("send_wait"):
            for work, _ in self._pending:
                work.wait()
        self._pending = []

    def broadcast_from_last(self, tensor: torch.Tensor) -> torch.Tensor:
        """NOTE: every stage joins this broadcast."""
        with timeline.span("broadcast"):
            dist.broadcast(tensor, self.ranks[-1], group=self.group)
        return tensor


def balanced_stages(weights: list[int], num_stages: int) -> list[int]:
    """Blocks per stage: contiguous, at least one each, the heaviest stage as light as possible."""
    if num_stages > len(weights):
        raise ValueError(f"{num_stages} pipeline stages need at least as many blocks, the model has {len(weights)}")
    prefix = [0]
    for w in weights:
        prefix.append(prefix[-1] + w)
    n = len(weights)
    # best[k][j]: smallest heaviest-stage weight putting the first j blocks into k stages
    inf = float("inf")
    best = [[inf] * (n + 1) for _ in range(num_stages + 1)]
    cut = [[0] * (n + 1) for _ in range(num_stages + 1)]
    best[0][0] = 0
    for k in range(1, num_stages + 1):
        for j in range(k, n + 1):
            for i in range(k - 1, j):
                cost = max(best[k - 1][i], prefix[j] - prefix[i])
                if cost < best[k][j]:
                    best[k][j], cut[k][j] = cost, i
    sizes, j = [], n
    for k in range(num_stages, 0, -1):
        sizes.append(j - cut[k][j])
        j = cut[k][j]
    return sizes[::-1]


def block_weight(module: nn.Module) -> int:
    """What a block weighs when stages are balanced: its parameter count.

    Counts, not bytes: every rank must split alike, though a rank's own blocks may be in the
    working dtype, others' still fp32 on the meta device, and FP8 layers (quantized while
    loading) hold buffers that stand for `stands_for_numel` parameters.
    """
    return sum(p.numel() for p in module.parameters()) + sum(
        getattr(m, "stands_for_numel", 0) for m in module.modules())


def _named(module, args, kwargs) -> dict:
    forward = module.forward
    signature = module.signature if isinstance(module, SkipBlock) else inspect.signature(forward)
    return dict(signature.bind_partial(*args, **kwargs).arguments)
