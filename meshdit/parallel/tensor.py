"""Tensor parallelism applied to an unmodified diffusers transformer: each block's Linears split over the tp ranks.

Column-parallel Linears (Q/K/V, MLP-in) keep their share of the output features, row-parallel ones (attention
out, MLP-out) their share of the input features; a row-parallel Linear's partial output is summed over the tp
group (comm.tensor_parallel_all_reduce) and its bias added once, after the sum. Attention heads are split by
whole heads, unevenly where the count does not divide (heads [2, 1] for 3 heads over 2 ranks), and each
attention module's `heads` is set to its local count, so the diffusers processor attends over the local heads
with torch's SDPA (or, under Ulysses, the all-to-all runs over the local heads).

Which Linears: the family's TensorPlan, else the transformer's own diffusers `_tp_plan` (read here, so the two
name the same layers: tests/models/test_diffusers_guard.py) with the family's GATHERED modulation added. Only the blocks
of the stage plan's block lists are split; embeddings and the final projection stay whole on every rank. A
GATHERED Linear (adaLN modulation) keeps its share of the output features and all-gathers its output; an
ACROSS_HEADS RMSNorm (Wan's Q/K norm) keeps its share of the weight and all-reduces its sums of squares.
"""
from __future__ import annotations

import fnmatch
from dataclasses import dataclass, field

import torch
from torch import nn

from ..distributed.comm import all_gather_uneven, group_rank, group_size, split_sizes, tensor_parallel_all_reduce
from ..errors import ConfigError
from .plan import ACROSS_HEADS, COLUMN, GATHERED, ROW, Packed, StagePlan, TensorPlan

_DIFFUSERS_STYLES = {"colwise": COLUMN, "rowwise": ROW}


def plan_from_model(transformer: nn.Module) -> TensorPlan | None:
    """The transformer's diffusers `_tp_plan` in meshdit's words (None if its class has none)."""
    tp_plan = getattr(type(transformer), "_tp_plan", None)
    if not tp_plan:
        return None
    styles = {}
    for pattern, style in tp_plan.items():
        if isinstance(style, str):
            styles[pattern] = _DIFFUSERS_STYLES[style]
        else:  # diffusers' PackedColwiseParallel / PackedRowwiseParallel
            packed_style = COLUMN if "Colwise" in type(style).__name__ else ROW
            blocks = getattr(style, "blocks", None)
            styles[pattern] = Packed(packed_style, tuple(blocks) if blocks else None)
    return TensorPlan(styles)


def tensor_plan_for(transformer: nn.Module, family_plan: TensorPlan | None) -> TensorPlan | None:
    """The family's plan when it has Linear styles of its own; else the model's `_tp_plan` with the family's
    GATHERED globs (the modulation) added."""
    if family_plan is not None and family_plan.styles:
        return family_plan
    model_plan = plan_from_model(transformer)
    if model_plan is None:
        return None
    extra = {glob: GATHERED for glob in (family_plan.gathered if family_plan is not None else ())}
    return TensorPlan({**model_plan.styles, **extra})


def head_split(heads: int, ranks: int) -> list[int]:
    """Whole heads per tp rank: the first heads % ranks ranks hold one more."""
    return split_sizes(heads, ranks)


def part_sizes(size: int, heads: int, ranks: int) -> list[int]:
    """How a dimension of `size` features is split over the ranks: in proportion to each rank's heads when
    `size` divides by the head count (Q/K/V by whole heads; an MLP of width k x heads alike), else evenly.
    Producer and consumer of a feature dimension apply the same rule to the same size, so they agree."""
    if size % heads == 0:
        return [h * (size // heads) for h in head_split(heads, ranks)]
    return split_sizes(size, ranks)


def _block_sizes(total: int, blocks: tuple[int, ...] | None) -> list[int]:
    if not blocks:
        return [total]
    unit, rest = divmod(total, sum(blocks))
    if rest:
        raise ConfigError(f"tensor plan: packed blocks {blocks} do not divide {total} features")
    return [b * unit for b in blocks]


def local_index(total: int, blocks: tuple[int, ...] | None, heads: int, ranks: int, rank: int) -> torch.Tensor:
    """Indices of the features of a split dimension this rank keeps, block by block."""
    pieces, offset = [], 0
    for size in _block_sizes(total, blocks):
        parts = part_sizes(size, heads, ranks)
        start = offset + sum(parts[:rank])
        pieces.append(torch.arange(start, start + parts[rank]))
        offset += size
    return torch.cat(pieces)


@dataclass
class TensorParallel:
    """What apply_tensor_parallel did: which paths need a collective after them (install_reduces adds the hooks)."""

    group: object
    row_biases: dict[str, torch.Tensor | None] = field(default_factory=dict)
    gathered: dict[str, list[int]] = field(default_factory=dict)
    """GATHERED Linear path -> every rank's output features."""
    norms: dict[str, int] = field(default_factory=dict)
    """ACROSS_HEADS RMSNorm path -> the whole width it normalises over."""
    handles: list = field(default_factory=list)
    shards: dict = field(default_factory=dict)
    """Linear path -> its LinearShard on this rank (what update_weights cuts new weights by: meshdit/rl/weights.py)."""

    def install_reduces(self, transformer: nn.Module) -> None:
        """The all-reduce (and bias) after each row-parallel Linear and the all-gather after each GATHERED one,
        on whatever module now sits at its path (an Fp8Linear made after the split included)."""
        for path, bias in self.row_biases.items():
            self.handles.append(transformer.get_submodule(path).register_forward_hook(self._reduce_hook(bias)))
        for path, lens in self.gathered.items():
            self.handles.append(transformer.get_submodule(path).register_forward_hook(self._gather_hook(lens)))
        for path, width in self.norms.items():
            self.handles.append(transformer.get_submodule(path).register_forward_hook(self._norm_hook(width)))

    def _norm_hook(self, width: int):
        group = self.group

        def norm(module, args, _out):  # x: [B, S, F/tp]; the module's own (local-statistics) output is replaced
            x = args[0]
            squares = tensor_parallel_all_reduce(x.pow(2).sum(-1, keepdim=True), group,
                                                 kind="tensor_parallel_norm")  # [B, S, 1]
            eps = module.eps if module.eps is not None else torch.finfo(x.dtype).eps
            out = x * torch.rsqrt(squares / width + eps)
            return out if module.weight is None else out * module.weight

        return norm

    def _gather_hook(self, lens: list[int]):
        group = self.group

        def gather(_module, _args, out):  # out: [B, F/tp] -> [B, F]
            return all_gather_uneven(out.contiguous(), -1, lens, group, kind="tensor_parallel_all_gather")

        return gather

    def _reduce_hook(self, bias):
        group = self.group

        def reduce(_module, _args, out):  # out: [B, S, D], this rank's partial sum
            out = tensor_parallel_all_reduce(out, group)
            return out if bias is None else out + bias

        return reduce


def resolve(transformer: nn.Module, plan: TensorPlan, stages: StagePlan) -> dict[str, str | Packed]:
    """Linear path -> style, for every Linear of the block lists a pattern names (first pattern wins)."""
    roots = tuple(spec.path + "." for spec in stages.blocks)
    found = {}
    for path, module in transformer.named_modules():
        if not path.startswith(roots) or not isinstance(module, (nn.Linear, nn.RMSNorm)):
            continue
        for pattern, style in plan.styles.items():
            if fnmatch.fnmatchcase(path, pattern):
                if (style == ACROSS_HEADS) != isinstance(module, nn.RMSNorm):
                    raise ConfigError(f"tensor plan: {path} is a {type(module).__name__}, not what {style} splits")
                found[path] = style
                break
    return found


def _heads(transformer: nn.Module, ranks: int) -> int:
    config = transformer.config
    heads = int(config["num_attention_heads"] if "num_attention_heads" in config else config["n_heads"])  # Z-Image
    if heads < ranks:
        raise ConfigError(f"tensor parallel degree {ranks} exceeds the model's {heads} attention heads: use "
                          f"--tensor-parallel-degree <= {heads}.")
    return heads


@dataclass(frozen=True)
class LinearShard:
    """How one Linear (or ACROSS_HEADS RMSNorm) splits: the style, and the features of its split dimension this
    rank keeps."""

    style: str  # COLUMN, GATHERED, ROW or ACROSS_HEADS
    keep: torch.Tensor  # indices into out_features (COLUMN, GATHERED), in_features (ROW), the norm's width
    lens: list[int]  # every rank's count of those features (GATHERED's all-gather)


def linear_shards(transformer: nn.Module, plan: TensorPlan, stages: StagePlan, ranks: int,
                  rank: int) -> dict[str, LinearShard]:
    """Linear path -> its shard on this rank. Works on a meta skeleton (lean loading) as on loaded weights."""
    heads = _heads(transformer, ranks)
    shards = {}
    for path, style in resolve(transformer, plan, stages).items():
        linear = transformer.get_submodule(path)
        kind, blocks = (style.style, style.blocks) if isinstance(style, Packed) else (style, None)
        if isinstance(style, Packed) and blocks is None:
            blocks = tuple(getattr(linear, "_tp_packed_col_blocks" if kind == COLUMN else "_tp_packed_row_blocks"))
        if kind == ACROSS_HEADS:
            total = linear.normalized_shape[-1]
        else:
            total = linear.in_features if kind == ROW else linear.out_features
        if blocks and any(size % heads for size in _block_sizes(total, blocks)):
            # a processor that cuts the fused output by the global ratio (FLUX.2) needs every part in proportion
            raise ConfigError(f"{path}: its fused parts {_block_sizes(total, blocks)} do not divide by the model's "
                              f"{heads} heads, so tensor parallelism cannot split them in proportion: drop "
                              "--tensor-parallel-degree.")
        keep = local_index(total, blocks, heads, ranks, rank)
        lens = [len(local_index(total, blocks, heads, ranks, r)) for r in range(ranks)]
        shards[path] = LinearShard(kind, keep, lens)
    return shards


def parameter_shard(shards: dict[str, LinearShard], name: str) -> tuple[int, torch.Tensor] | None:
    """(dim, kept indices) of parameter `name` (e.g. "...to_q.weight") on this rank; None: held whole (a row
    Linear's bias, anything outside the plan)."""
    path, _, leaf = name.rpartition(".")
    shard = shards.get(path)
    if shard is None or leaf not in ("weight", "bias"):
        return None
    if shard.style == ROW:
        return (1, shard.keep) if leaf == "weight" else None
    return 0, shard.keep  # COLUMN, GATHERED, ACROSS_HEADS


class ShardWhileLoading:
    """load_model's on_loaded: each split weight is cut to this rank's shard as it lands, so the rank never
    holds a whole block's weights (what it materialises is a view of the shared mapping, or one tensor in
    flight when streamed)."""

    def __init__(self, plan: TensorPlan | None, stages: StagePlan, ranks: int, rank: int) -> None:
        self.plan, self.stages, self.ranks, self.rank = plan, stages, ranks, rank
        self.shards: dict[str, LinearShard] | None = None

    def __call__(self, model: nn.Module, name: str) -> None:
        if self.shards is None:  # the skeleton's Linears, before any of them is cut
            plan = tensor_plan_for(model, self.plan)
            self.shards = {} if plan is None else linear_shards(model, plan, self.stages, self.ranks, self.rank)
        cut = parameter_shard(self.shards, name)
        if cut is None:
            return
        path, _, leaf = name.rpartition(".")
        module = model.get_submodule(path)
        dim, keep = cut
        whole = module._parameters[leaf]
        if whole.device.type == "meta" or whole.shape[dim] == len(keep):
            return
        module._parameters[leaf] = nn.Parameter(whole.detach().index_select(dim, keep.to(whole.device)),
                                                requires_grad=False)
        # PipeFusion balances stages by parameter counts (pipefusion.block_weight), on the skeleton while loading
        # and on the loaded blocks later: the cut part still counts, so both cuts, on every tp rank, agree
        cut_away = whole.numel() - module._parameters[leaf].numel()
        module.stands_for_numel = getattr(module, "stands_for_numel", 0) + cut_away


def apply_tensor_parallel(transformer: nn.Module, plan: TensorPlan, stages: StagePlan, group) -> TensorParallel:
    """Splits the named Linears' weights in place (a rank keeps only its shards; weights lean loading already
    cut are left as they are) and sets each attention module's local head count. Call `install_reduces` after
    any module swap (FP8) to add the all-reduces."""
    ranks, rank = group_size(group), group_rank(group)
    heads = _heads(transformer, ranks)
    done = TensorParallel(group)
    shards = done.shards = linear_shards(transformer, plan, stages, ranks, rank)
    if not shards:
        raise ConfigError(f"{type(transformer).__name__}: its tensor plan names no Linear of its blocks; "
                          "drop --tensor-parallel-degree.")
    for path, shard in shards.items():
        linear = transformer.get_submodule(path)
        if shard.style == ROW:
            done.row_biases[path] = _shard_rows(linear, shard.keep)
        elif shard.style == ACROSS_HEADS:
            done.norms[path] = sum(shard.lens)
            linear.normalized_shape = (len(shard.keep),)  # its own forward runs on the shard; the hook's output wins
            if linear.weight is not None and linear.weight.shape[0] != len(shard.keep):
                linear.weight = nn.Parameter(linear.weight.detach()[shard.keep].clone(), requires_grad=False)
        else:
            if shard.style == GATHERED:
                done.gathered[path] = shard.lens
            _shard_columns(linear, shard.keep)
    from diffusers.models.attention_processor import Attention

    local_heads = head_split(heads, ranks)[rank]
    for path in {p.rsplit(".", 1)[0] for p, s in shards.items() if s.style == COLUMN}:
        owner = _attention_above(transformer, path)
        if owner is not None:
            if isinstance(owner, Attention):  # its processors may read head_dim as inner_dim // heads (Qwen-Image's);
                owner.inner_dim = local_heads * (owner.inner_dim // owner.heads)  # FLUX.2's own class cuts by inner_dim
            owner.heads = local_heads
    return done


def _attention_above(transformer: nn.Module, path: str):
    """The diffusers attention module at `path` or above it (a Linear's parent, or to_out's grandparent)."""
    while path:
        module = transformer.get_submodule(path)
        if hasattr(module, "processor") and hasattr(module, "heads"):
            return module
        path = path.rsplit(".", 1)[0] if "." in path else ""
    return None


def _shard_columns(linear: nn.Linear, keep: torch.Tensor) -> None:
    # weight [out, in] -> [out_local, in] (unless lean loading already cut it)
    if linear.weight.shape[0] != len(keep):
        linear.weight = nn.Parameter(linear.weight.detach()[keep].clone(), requires_grad=False)
    if linear.bias is not None and linear.bias.shape[0] != len(keep):
        linear.bias = nn.Parameter(linear.bias.detach()[keep].clone(), requires_grad=False)
    linear.out_features = len(keep)


def _shard_rows(linear: nn.Linear, keep: torch.Tensor) -> torch.Tensor | None:
    """weight [out, in] -> [out, in_local]; returns the bias (taken off the Linear: added once, after the sum)."""
    if linear.weight.shape[1] != len(keep):
        linear.weight = nn.Parameter(linear.weight.detach()[:, keep].clone(), requires_grad=False)
    linear.in_features = len(keep)
    bias = None if linear.bias is None else linear.bias.detach().clone()
    linear.bias = None
    return bias
