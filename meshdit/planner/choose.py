"""The planner: every legal layout of a world with its prediction, and the one it recommends."""
from __future__ import annotations

import os
from dataclasses import dataclass, replace

from ..config import GenerateRequest, ParallelConfig
from ..errors import ConfigError
from ..models.info import ModelInfo
from .hardware import World
from .layouts import legal_layouts
from .model_costs import ModelCosts, costs_of
from .predict import Prediction, predict
from .snapshots import resolve_model, unknown_model_note

MAX_WORLD_SEARCHED = 256
"""The largest world `smallest_fitting_world` tries."""


@dataclass(frozen=True)
class Plan:
    world: World
    costs: ModelCosts
    request: GenerateRequest
    rows: tuple[Prediction, ...]
    """Fitting first, each group fastest first."""
    recommended: Prediction | None

    @property
    def fitting(self) -> tuple[Prediction, ...]:
        return tuple(r for r in self.rows if r.fits)


def load_model(model: str) -> tuple[str, ModelInfo, ModelCosts]:
    """(folder, info, costs) of a model folder, Hub id or built-in snapshot name."""
    folder = resolve_model(model)
    try:
        info = ModelInfo.from_pretrained(folder)
    except ConfigError as exc:
        if os.path.isdir(folder):
            raise
        raise ConfigError(f"{unknown_model_note(model)}; as a folder or Hub id: {exc}") from None
    return folder, info, costs_of(folder, info)


def make_plan(info: ModelInfo, costs: ModelCosts, request: GenerateRequest, world: World,
              fp8_options: bool = True, exact_only: bool = False, fixed: dict[str, int] | None = None) -> Plan:
    """request: unset values are filled from the model's defaults. exact_only: only layouts that give serial's
    image. fixed: {axis: degree} every layout keeps (the degrees a user gave beside --layout auto)."""
    from ..request import resolve_request

    # what no layout can fix (size, frames) is refused as generate does
    request = resolve_request(request, info, ParallelConfig())
    layouts = legal_layouts(info, request, world.size, fp8_options=fp8_options, parallel_vae=costs.vae_splits)
    if fixed:
        layouts = [layout for layout in layouts if all(layout.degree(a) == d for a, d in fixed.items())]
    rows = _faster_decode([predict(layout, costs, world, request) for layout in layouts])
    # variants that hold less, listed only where the plain one does not fit: a tiled decode (bounded error),
    # the text encoders split over the ranks (--text-encoder-parallel) or on the host (--text-encoder-device cpu),
    # and a tiled decode with either (a VAE meshdit cannot split is never tiled)
    text_moves = ({"text_parallel": True}, {"text_on_cpu": True})
    tiled = (({"vae": "tiled"},) + tuple({"vae": "tiled", **t} for t in text_moves)) if costs.vae_splits else ()
    for change in text_moves + tiled:
        moves_text = "text_on_cpu" in change or "text_parallel" in change
        rows += [predict(replace(r.layout, **change), costs, world, request) for r in list(rows)
                 if not r.fits and (r.layout.vae == "plain" or "vae" not in change)
                 and not (r.layout.text_on_cpu or r.layout.text_parallel)
                 and (not moves_text or (r.memory.text and not world.shares_host_memory))
                 and (world.size > 1 or "text_parallel" not in change)]
    if not world.shares_host_memory:  # and the blocks in host memory (--offload blocks), with any of those
        rows += [predict(replace(r.layout, offload=True), costs, world, request) for r in list(rows) if not r.fits]
    rows = _dedupe(rows)
    rows.sort(key=lambda r: (not r.fits, r.total_s, r.memory.peak))
    pool = [r for r in rows if r.fits and r.exact] or ([] if exact_only else [r for r in rows if r.fits])
    return Plan(world, costs, request, tuple(rows), _pick(pool))


def _pick(pool: list[Prediction]) -> Prediction | None:
    """Among the layouts within 2% of the fastest (closer than the model can tell apart), the plainest (no FP8,
    text on the device, untiled), then the one with the least communication left unhidden (what a loaded link
    or a slower-than-modelled network makes worse), then the fastest, then the least memory."""
    if not pool:
        return None
    fastest = min(r.total_s for r in pool)
    near = [r for r in pool if r.total_s <= fastest * 1.02]
    return min(near, key=lambda r: (_plain_first(r), round(r.comm_s, 9), r.total_s, r.memory.peak))


def _without_tiling(plan: Plan) -> Prediction | None:
    """The recommendation among the rows without a tiled decode (its bounded error is the user's to choose)."""
    rows = [r for r in plan.rows if r.fits and r.layout.vae != "tiled"]
    return _pick([r for r in rows if r.exact] or rows)


def _plain_first(row: Prediction) -> int:
    """Among near-equal layouts prefer no FP8, the text encoders on the device, an untiled decode."""
    return int(row.layout.fp8) + int(row.layout.text_on_cpu) + int(row.layout.text_parallel) + \
        int(row.layout.offload) + int(row.layout.vae == "tiled")


def _faster_decode(rows: list[Prediction]) -> list[Prediction]:
    """Of each layout's plain and parallel decode (both exact), the one that fits, then the faster."""
    best: dict = {}
    for r in rows:
        key = replace(r.layout, vae="plain")
        if key not in best or (not best[key].fits, best[key].total_s) > (not r.fits, r.total_s):
            best[key] = r
    return list(best.values())


def _dedupe(rows: list[Prediction]) -> list[Prediction]:
    """A text-on-CPU variant is listed only where it changes whether the layout fits."""
    seen, out = set(), []
    for r in rows:
        if r.layout in seen:
            continue
        seen.add(r.layout)
        out.append(r)
    return out


def smallest_fitting_world(info: ModelInfo, costs: ModelCosts, request: GenerateRequest, world: World,
                           exact_only: bool = False, fixed: dict[str, int] | None = None) -> int | None:
    """The fewest ranks (same GPUs, same per-node count) with a layout that fits; None if none up to
    MAX_WORLD_SEARCHED."""
    for size in range(world.size + 1, MAX_WORLD_SEARCHED + 1):
        per_node = min(size, world.gpus_per_node)
        if size % per_node:
            continue
        plan = make_plan(info, costs, request, world.with_size(per_node, size // per_node), exact_only=exact_only,
                         fixed=fixed)
        if plan.recommended is not None:
            return size
    return None


def auto_config(model: str, request: GenerateRequest, world: World, compile: str | None = None,
                fixed: dict[str, int] | None = None) -> tuple[ParallelConfig, Prediction]:
    """The planner's layout for --layout auto (exact layouts first; FP8 and tiled decodes are never chosen for
    the user). ConfigError naming the smallest world that would fit when none does."""
    _, info, costs = load_model(model)
    plan = make_plan(info, costs, request, world, fp8_options=False, fixed=fixed)
    plan = replace(plan, recommended=_without_tiling(plan))
    if plan.recommended is None:
        if fixed and not plan.rows:
            given = ", ".join(f"{axis} {degree}" for axis, degree in fixed.items())
            raise ConfigError(f"--layout auto with {given}: no legal layout of {world.size} rank(s) keeps those "
                              "degrees; drop them or change --ranks.")
        smallest = smallest_fitting_world(info, costs, request, world, fixed=fixed)
        if smallest:
            where = f"the smallest world in which one fits has {smallest} ranks: use --ranks {smallest}"
        elif world.shares_host_memory:
            where = "more CPU ranks do not help (they share this machine's memory): use a machine with more memory"
        else:
            where = f"no world up to {MAX_WORLD_SEARCHED} ranks fits it"
        raise ConfigError(
            f"--layout auto: no layout of {world.size} rank(s) with {world.memory_bytes / 1e9:.1f} GB each fits "
            f"this model and request ({len(plan.rows)} legal layouts, the smallest needs "
            f"{min((r.memory.peak for r in plan.rows), default=0) / 1e9:.1f} GB per rank); {where}, or lower "
            "the size (see `meshdit plan` for the table).")
    return plan.recommended.layout.parallel_config(compile), plan.recommended
