"""DBCache / First-Block Cache on the unmodified diffusers transformer, through hooks on the plan's block lists.

The plan's block lists (StagePlan), concatenated, are the transformer's N blocks: the first F_n always run and give
the change signal, the last B_n always run, the middle ones are skipped at a cached step. Hooks only:
- a pre-hook on the transformer counts its calls within a step: each call (a guidance branch, or the branches
  batched) keeps its own state, a Slot, whose rows are that call's images;
- a pre-hook on the first front block of the signal's list keeps its input, a forward hook on block F_n-1 forms
  the residual and decides per row (signal.relative_change: global sums over the SP group);
- each middle block's forward passes its carried activations through when every row of the call is cached;
- the middle blocks of each block list form a segment: a pre-hook on its first block keeps the input, a forward
  hook on its last block stores the segment's residual (computed rows) or adds the cached / forecast one
  (cached rows).
Decisions are per image and per guidance branch, as a one-process run makes them (docs/caching.md, "Exact
under parallelism"). Installed for one generation and removed after it.
"""
from __future__ import annotations

import inspect
from dataclasses import dataclass, field

import torch
from torch import nn

from ..distributed.comm import all_reduce, broadcast, group_rank, group_size
from ..parallel.pipefusion import SkipBlock
from ..parallel.plan import BlockList, StagePlan
from ..cache_settings import CacheSettings
from .signal import relative_change


@dataclass
class _Segment:
    """The middle blocks of one block list: their carried input at the first, residual at the last."""

    spec: BlockList
    residual: dict = field(default_factory=dict)  # per slot: carry -> [d0, d1, d2] Taylor terms [B, ...]
    absent: set = field(default_factory=set)  # streams the last block returns as None (SD3's last block: no text)


@dataclass
class Slot:
    """One transformer call per step (a branch, or batched branches): per-row state across steps."""

    rows: int
    prev_signal: torch.Tensor | None = None  # [B, S/sp, D] the signal residual at each row's last computed step
    cached: list = field(default_factory=list)  # this step: per row, True = the middle blocks' residual reused
    consecutive: list = field(default_factory=list)  # per row: cached steps in a row so far
    last_step: list = field(default_factory=list)  # per row: the last computed step
    computed: list = field(default_factory=list)  # per row: computed steps so far
    history: list = field(default_factory=list)  # per step: the `cached` list
    steps: list = field(default_factory=list)  # the step of each history entry
    segment_input: dict = field(default_factory=dict)  # segment index -> carry -> tensor, this step
    signal_input: torch.Tensor | None = None  # [B, S/sp, D] this step's input of the signal's first block

    @property
    def all_cached(self) -> bool:
        return bool(self.cached) and all(self.cached)


class StepCache:
    """The cache of one denoiser for one generation. `begin_step(i)` before each step; `remove()` after."""

    def __init__(self, transformer: nn.Module, plan: StagePlan, settings: CacheSettings, group,
                 stage_group=None) -> None:
        """group: the ranks that share one image's tokens (SP); stage_group: PipeFusion's pp group (None: no
        PipeFusion), over which the stage that runs block F_n - 1 broadcasts its decision."""
        self.settings = settings.resolved()
        self.group = group
        self.step = 0
        self.calls = 0
        self.slots: list[Slot] = []
        self.slot: Slot | None = None
        self.handles: list = []
        modules = dict(transformer.named_modules())
        blocks = [(spec, modules[spec.path][i], start) for spec, start in _list_starts(plan, modules)
                  for i in range(len(modules[spec.path]))]
        n, front, back = len(blocks), self.settings.front_blocks, self.settings.back_blocks
        self.settings.check_blocks(n)
        # a SkipBlock (another PipeFusion stage's block) binds arguments with the signature of the block it replaces
        self._signatures = {id(b): getattr(b, "signature", None) or inspect.signature(b.forward) for _, b, _ in blocks}
        sig_spec, sig_block, sig_list_start = blocks[front - 1]
        self._sig_spec = sig_spec
        self.stage_group = stage_group
        self.decides = not isinstance(sig_block, SkipBlock)
        self.decider = _decider_stage(self.decides, stage_group, transformer)
        self._hook(transformer.register_forward_pre_hook(self._new_call))
        self._hook(blocks[sig_list_start][1].register_forward_pre_hook(self._keep_signal_input, with_kwargs=True))
        self._hook(sig_block.register_forward_hook(self._decide))
        self.segments: list[_Segment] = []
        # PipeFusion: each stage's own middle blocks of a list form its segments (their input arrives at the
        # stage's first block, after the stage's receive hook)
        middle = [(s, b, i) for s, b, i in blocks[front:n - back] if not isinstance(b, SkipBlock)]
        for spec in plan.blocks:
            mine = [b for s, b, _ in middle if s is spec]
            if not mine:
                continue
            index = len(self.segments)
            self.segments.append(_Segment(spec))
            self._hook(mine[0].register_forward_pre_hook(self._keep_segment_input(index), with_kwargs=True))
            for block in mine:
                self._skip_when_cached(block, spec)
            self._hook(mine[-1].register_forward_hook(self._apply_segment(index), with_kwargs=True))

    # -- steps and calls --------------------------------------------------
    def begin_step(self, step: int) -> None:
        self.step, self.calls = step, 0

    def _new_call(self, module, args) -> None:
        if self.calls == len(self.slots):
            self.slots.append(Slot(rows=0))
        self.slot = self.slots[self.calls]
        self.calls += 1

    # -- the signal and the decision ----------------------------------------
    def _named(self, block, args, kwargs) -> dict:
        return dict(self._signatures[id(block)].bind_partial(*args, **kwargs).arguments)

    def _keep_signal_input(self, block, args, kwargs) -> None:
        self.slot.signal_input = self._named(block, args, kwargs)[self._sig_spec.carry[0]]

    @torch.compiler.disable
    def _decide(self, block, args, output) -> None:
        """Per row: cached (True) or computed this step; every rank of the group takes the same decision."""
        slot, s, step = self.slot, self.settings, self.step
        residual = _outputs(self._sig_spec, output)[self._sig_spec.carry[0]] - slot.signal_input  # [B, S/sp, D]
        rows = residual.shape[0]
        if not slot.rows:
            slot.rows = rows
            slot.consecutive, slot.last_step, slot.computed = [0] * rows, [-1] * rows, [0] * rows
        forced = slot.prev_signal is None or step < s.warmup or step in s.compute_steps
        cached = [False] * rows
        if self.decides and not forced:
            change = relative_change(residual, slot.prev_signal, self.group).tolist()  # [B]
            cached = [change[r] < s.threshold and slot.consecutive[r] < s.max_cached for r in range(rows)]
        if self.decider is not None:  # PipeFusion: the deciding stage's decision, on every stage
            flags = torch.tensor(cached, dtype=torch.int32, device=residual.device)
            cached = [bool(f) for f in broadcast(flags, self.decider, self.stage_group,
                                                 "cache_decision_broadcast").tolist()]
        computed_rows = [r for r in range(rows) if not cached[r]]
        if slot.prev_signal is None:
            slot.prev_signal = residual.clone()
        elif computed_rows:
            slot.prev_signal[computed_rows] = residual[computed_rows]
        for r in range(rows):
            slot.consecutive[r] = slot.consecutive[r] + 1 if cached[r] else 0
        slot.cached = cached
        slot.history.append(list(cached))
        slot.steps.append(step)

    # -- the middle blocks -------------------------------------------------
    def _skip_when_cached(self, block: nn.Module, spec: BlockList) -> None:
        original, signature = block.forward, self._signatures[id(block)]

        def forward(*args, **kwargs):
            if self.slot is not None and self.slot.all_cached:
                named = signature.bind_partial(*args, **kwargs).arguments
                return named[spec.returns] if isinstance(spec.returns, str) else tuple(named[n] for n in spec.returns)
            return original(*args, **kwargs)

        forward.__signature__ = signature
        block.forward = forward
        self.handles.append(_Restore(block))

    def _keep_segment_input(self, index: int):
        def hook(block, args, kwargs):
            named = self._named(block, args, kwargs)
            self.slot.segment_input[index] = {name: named[name] for name in self.segments[index].spec.carry}
        return hook

    def _apply_segment(self, index: int):
        segment = self.segments[index]

        @torch.compiler.disable
        def hook(block, args, kwargs, output):
            slot = self.slot
            inputs, outputs = slot.segment_input.pop(index), _outputs(segment.spec, output)
            terms = segment.residual.setdefault(id(slot), {})
            cached = [r for r in range(slot.rows) if slot.cached[r]]
            computed = [r for r in range(slot.rows) if not slot.cached[r]]
            result = {}
            for name, out in outputs.items():
                # a stream the segment's last block does not return (None when computed; a cached step passes
                # the input through): the cached segment returns None too, as the block does
                if out is None or name in segment.absent:
                    if out is None:
                        segment.absent.add(name)
                    result[name] = None
                    continue
                if computed:
                    self._store(terms, name, out - inputs[name], computed, slot)
                if cached:
                    out = out.clone()  # all cached: `out` is the segment's input itself, passed through
                    out[cached] = inputs[name][cached] + self._forecast(terms[name], cached, slot)
                result[name] = out
            if computed:  # the last segment's store closes the step for these rows
                if index == len(self.segments) - 1:
                    for r in computed:
                        slot.last_step[r], slot.computed[r] = self.step, slot.computed[r] + 1
            if not cached:
                return None
            return _pack(segment.spec, result, output)
        return hook

    def _store(self, terms: dict, name: str, residual: torch.Tensor, rows: list[int], slot: Slot) -> None:
        """The computed rows' residual, and (TaylorSeer) its finite differences over the computed steps."""
        order = self.settings.taylorseer or 0
        if name not in terms:
            terms[name] = [torch.zeros_like(residual) for _ in range(order + 1)]
        d = terms[name]
        fresh = residual[rows]  # [b, ...]
        if order:
            seen = [r for r in rows if slot.computed[r] > 0]
            if seen:
                pick = [rows.index(r) for r in seen]
                dt = torch.tensor([self.step - slot.last_step[r] for r in seen], dtype=residual.dtype,
                                  device=residual.device).view(-1, *[1] * (residual.dim() - 1))  # [b', 1, ...]
                new = [fresh[pick]]
                for k in range(1, order + 1):
                    new.append((new[k - 1] - d[k - 1][seen]) / dt)
                    if k == 2:  # a second difference needs two earlier computed steps
                        twice = torch.tensor([slot.computed[r] > 1 for r in seen], device=residual.device)
                        new[2] = torch.where(twice.view_as(dt), new[2], torch.zeros_like(new[2]))
                for k in range(1, order + 1):
                    d[k][seen] = new[k]
        d[0][rows] = fresh

    def _forecast(self, d: list, rows: list[int], slot: Slot) -> torch.Tensor:
        """The cached rows' residual: the last computed one, or its Taylor series at this step."""
        value = d[0][rows]
        if len(d) > 1:
            s = torch.tensor([self.step - slot.last_step[r] for r in rows], dtype=value.dtype,
                             device=value.device).view(-1, *[1] * (value.dim() - 1))  # [b, 1, ...]
            value = value + d[1][rows] * s
            if len(d) > 2:
                value = value + d[2][rows] * (s * s / 2)
        return value

    # -- reporting and removal -------------------------------------------------
    def masks(self) -> list[list[list[bool]]]:
        """Per call slot, per row: per step, True where the row was cached."""
        return [[[step[r] for step in slot.history] for r in range(slot.rows)] for slot in self.slots]

    @property
    def steps_run(self) -> list[list[int]]:
        """Per call slot: the steps it ran (all, except for one of Wan 2.2's experts)."""
        return [slot.steps for slot in self.slots]

    def _hook(self, handle) -> None:
        self.handles.append(handle)

    def remove(self) -> None:
        for handle in reversed(self.handles):
            handle.remove()
        self.handles = []


class _Restore:
    """Undoes _skip_when_cached: the block's own forward again."""

    def __init__(self, block: nn.Module) -> None:
        self.block = block

    def remove(self) -> None:
        self.block.__dict__.pop("forward", None)


def _decider_stage(decides: bool, stage_group, transformer: nn.Module) -> int | None:
    """The pp-group rank of the stage that runs block F_n - 1 (None without PipeFusion): one all-reduce (max)
    over the stages, when the caches are installed."""
    if group_size(stage_group) <= 1:
        return None
    device = next(transformer.parameters()).device
    rank = torch.tensor([group_rank(stage_group) if decides else -1], dtype=torch.int64, device=device)
    return int(all_reduce(rank, stage_group, "cache_decider_all_reduce", op="max").item())


def _list_starts(plan: StagePlan, modules: dict):
    """(block list, index of its first block among all blocks), in order."""
    start = 0
    for spec in plan.blocks:
        yield spec, start
        start += len(modules[spec.path])


def _outputs(spec: BlockList, output) -> dict:
    """A block's output as carry name -> tensor."""
    if isinstance(spec.returns, str):
        return {spec.returns: output}
    return dict(zip(spec.returns, output))


def _pack(spec: BlockList, values: dict, output):
    if isinstance(spec.returns, str):
        return values[spec.returns]
    return tuple(values[name] for name in spec.returns)
