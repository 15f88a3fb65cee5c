"""PipeFusion: the transformer's blocks split into stages over the pp axis, the image into patches.

Each rank keeps only its stage's blocks (the others become SkipBlocks that pass
activations through) and runs the unmodified model forward for one patch at a
time; hooks at the stage boundaries receive the previous stage's activations and
send this stage's on. Attention reads stale K/V (attention/stale_kv.py): a patch
refreshes its own slice and attends to the rest as last computed.
Stage traffic goes through a comm.PipeChannel (its sends do not block, so the
cycle in which the last stage hands stepped latents back to stage 0 cannot deadlock).
"""
from __future__ import annotations

import inspect
import re
import weakref

import torch
from torch import nn

from ..attention.stale_kv import StaleKV
from ..distributed.comm import PipeChannel, all_gather_object
from ..distributed.mesh import ParallelMesh
from ..mesh_axes import MeshAxis
from .plan import BlockList, StagePlan


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


class PipeFusion:
    """This rank's stage of the transformer, and the p2p traffic between stages."""

    def __init__(self, transformers: nn.Module | list[nn.Module], plan: StagePlan, mesh: ParallelMesh, seq_state,
                 codec_for=None, stale_kv_format: torch.dtype | None = None) -> None:
        """transformers: one, or a pipeline's experts (Wan 2.2), each cut into the same stages; one runs
        at a time, so they share the channel and the stale K/V (whose layers the experts name apart).
        codec_for: tensor -> its wire codec (None: exact). stale_kv_format: FP8 format of the stale K/V
        buffers (None: the working dtype)."""
        self.channel = PipeChannel(mesh.group(MeshAxis.PP), codec_for)
        self.stage = mesh.local_rank(MeshAxis.PP)
        self.num_stages = mesh.size(MeshAxis.PP)
        self.stale_kv = StaleKV(seq_state, stale_kv_format)
        seq_state.stale_kv = self.stale_kv
        self.handles = []
        for transformer in transformers if isinstance(transformers, (list, tuple)) else [transformers]:
            self._cut(transformer, plan)

    def _cut(self, transformer: nn.Module, plan: StagePlan) -> None:
        """Keeps this stage's blocks of `transformer` and hooks its stage boundaries and long skips."""
        modules = dict(transformer.named_modules())
        blocks = [(modules[spec.path], i, spec) for spec in plan.blocks for i in range(len(modules[spec.path]))]
        sizes = balanced_stages([block_weight(b[0][b[1]]) for b in blocks], self.num_stages)
        cuts = all_gather_object(sizes, self.channel.group, "pipefusion_cut")
        if any(cut != sizes for cut in cuts):  # a block run twice or never: a wrong image, so stop here
            raise RuntimeError(f"PipeFusion stages cut the blocks differently (blocks per stage, by stage: {cuts}): "
                               "every rank must weigh the blocks alike (parallel/pipefusion.block_weight)")
        starts = [sum(sizes[:s]) for s in range(self.num_stages)]
        mine = range(starts[self.stage], starts[self.stage] + sizes[self.stage])
        for index, (block_list, i, spec) in enumerate(blocks):
            if index not in mine:  # free the weights of other stages' blocks
                block_list[i] = _stand_in(block_list[i], spec)
        if self.stage > 0:
            block_list, i, spec = blocks[starts[self.stage]]
            self.handles.append(block_list[i].register_forward_pre_hook(self._receive_hook(spec), with_kwargs=True))
        if self.stage < self.num_stages - 1:
            block_list, i, spec = blocks[starts[self.stage + 1]]
            self.handles.append(block_list[i].register_forward_pre_hook(self._send_hook(spec), with_kwargs=True))
        self._connect_long_skips(plan, modules, [s for s in range(self.num_stages) for _ in range(sizes[s])])

    # NOTE: a long skip's source stage sends its block's output once per forward, right after the block;
    # the target stage receives it where its stand-in for that block runs, so both sides meet the
    # message in block order, before the boundary activations of the same forward.
    def _connect_long_skips(self, plan: StagePlan, modules: dict, owner: list[int]) -> None:
        """A block's output that a later block on another stage takes as a skip input travels there;
        on the target stage the source's SkipBlock returns what arrived instead of its input."""
        offset = 0
        for spec in plan.blocks:
            block_list = modules[spec.path]
            for source, target in (spec.long_skips(len(block_list)) if spec.long_skips else ()):
                sender, receiver = owner[offset + source], owner[offset + target]
                if sender == receiver:
                    continue
                if self.stage == sender:
                    @torch.compiler.disable
                    def send(_mod, _args, out, to=receiver):
                        self.channel.send(out, to)
                    self.handles.append(block_list[source].register_forward_hook(send))
                elif self.stage == receiver:
                    @torch.compiler.disable
                    def receive(_mod, _args, out, frm=sender):
                        return self.channel.recv(out, frm)  # `out` is the stand-in's input: the right shape
                    self.handles.append(block_list[source].register_forward_hook(receive))
            offset += len(block_list)

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
                named[name] = self.channel.recv(mine, self.stage - 1)
            return (), named
        return hook

    def _send_hook(self, spec: BlockList):
        @torch.compiler.disable
        def hook(module, args, kwargs):
            named = _named(module, args, kwargs)
            for name in spec.carry:
                self.channel.send(named[name], self.stage + 1)
        return hook


def _stand_in(block: nn.Module, spec: BlockList) -> SkipBlock:
    """The SkipBlock for `block`, keeping the hooks already on it: a sequence plan may split a block's input
    (Wan splits blocks.0's hidden_states), and every stage must split alike. The hook dicts are shared, so
    the handles that installed them still remove them."""
    skip = SkipBlock(spec, inspect.signature(block.forward))
    for name in ("_forward_pre_hooks", "_forward_pre_hooks_with_kwargs", "_forward_hooks",
                 "_forward_hooks_with_kwargs", "_forward_hooks_always_called"):
        setattr(skip, name, getattr(block, name))
    return skip


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


# Sub-modules whose work does not grow with the image: adaptive-norm modulation (a linear on the
# timestep embedding, once per sample) and the text stream (norm1_context, ff_context, attn.add_q_proj,
# attn.to_add_out: a few dozen tokens). diffusers names them alike across families.
_NOT_PER_IMAGE_TOKEN = re.compile(r"(^|\.)(norm[^.]*|[^.]*context[^.]*|add_[^.]*|to_add_[^.]*)(\.|$)")
# peft's adapter modules (lora_A, lora_B, lora_magnitude_vector, ...): a PipeFusion stage loads only its own
# blocks' adapters, so counting them would make each stage weigh the blocks differently and cut elsewhere.
_ADAPTER = re.compile(r"(^|\.)lora_[^.]*(\.|$)")


def block_weight(module: nn.Module) -> int:
    """What a block weighs when stages are balanced: the parameters it applies to every image token.

    A stage's time per patch follows its image-token work, not its parameter bytes: by plain parameter
    count a Flux double block (two streams, two modulations) weighs 2.4 single blocks, and PipeFusion 2
    put 3 of 4 equally slow blocks on one stage. Counts, not bytes: every rank must split alike, though
    a rank's own blocks may be in the working dtype, others' still fp32 on the meta device, and FP8
    layers (quantized while loading) hold buffers that stand for `stands_for_numel` parameters, and LoRA
    adapters (loaded before the cut, each stage only its own blocks') are left out.
    """
    total = 0
    for name, m in module.named_modules():
        if not _NOT_PER_IMAGE_TOKEN.search(name) and not _ADAPTER.search(name):
            total += sum(p.numel() for p in m.parameters(recurse=False)) + getattr(m, "stands_for_numel", 0)
    return total


_SIGNATURES: "weakref.WeakKeyDictionary[nn.Module, inspect.Signature]" = weakref.WeakKeyDictionary()


def _named(module, args, kwargs) -> dict:
    if isinstance(module, SkipBlock):
        signature = module.signature
    else:  # inspect.signature costs as much as a small op; the hooks ask once per block per patch
        signature = _SIGNATURES.get(module)
        if signature is None:
            signature = _SIGNATURES[module] = inspect.signature(module.forward)
    return dict(signature.bind_partial(*args, **kwargs).arguments)
