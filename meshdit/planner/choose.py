"""The planner: every legal layout of a world with its prediction, and the one it recommends."""
from __future__ import annotations

from dataclasses import dataclass, replace

from ..config import GenerateRequest, ParallelConfig
from ..errors import ConfigError
from ..models.info import ModelInfo
from .hardware import World
from .layouts import legal_layouts
from .model_costs import ModelCosts, costs_of
from .predict import Prediction, predict
from .snapshots import resolve_model

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
    info = ModelInfo.from_pretrained(folder)
    return folder, info, costs_of(folder, info)


def make_plan(info: ModelInfo, costs: ModelCosts, request: GenerateRequest, world: World,
              fp8_options: bool = True, exact_only: bool = False) -> Plan:
    """request: unset values are filled from the model's defaults. exact_only: only layouts that give serial's
    image (what --layout auto chooses from, unless none fits)."""
    request = request.with_defaults(info.request_defaults())
    info.check_request(ParallelConfig(), request)  # what no layout can fix (size, frames) is refused as generate does
    layouts = legal_layouts(info, request, world.size, fp8_options=fp8_options)
    rows = [predict(layout, costs, world, request) for layout in layouts]
    # variants that hold less, listed only where the plain one does not fit: a tiled decode (bounded error),
    # the text encoders on the host (--text-encoder-device cpu), both
    for change in ({"vae": "tiled"}, {"text_on_cpu": True}, {"vae": "tiled", "text_on_cpu": True}):
        rows += [predict(replace(r.layout, **change), costs, world, request) for r in list(rows)
                 if not r.fits and (r.layout.vae == "plain" or "vae" not in change) and not r.layout.text_on_cpu
                 and (r.memory.text or "text_on_cpu" not in change)]
    rows = _dedupe(rows)
    rows.sort(key=lambda r: (not r.fits, r.total_s, r.memory.peak))
    pool = [r for r in rows if r.fits and r.exact] or ([] if exact_only else [r for r in rows if r.fits])
    # cheapest first: among layouts within 2% of the fastest, the one that moves the fewest bytes and uses least
    best = None
    if pool:
        fastest = min(r.total_s for r in pool)
        near = [r for r in pool if r.total_s <= fastest * 1.02]
        best = min(near, key=lambda r: (_plain_first(r), r.total_s, r.memory.peak))
    return Plan(world, costs, request, tuple(rows), best)


def _plain_first(row: Prediction) -> int:
    """Among near-equal layouts prefer no FP8, the text encoders on the device, an untiled decode."""
    return int(row.layout.fp8) + int(row.layout.text_on_cpu) + int(row.layout.vae == "tiled")


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
                           exact_only: bool = False) -> int | None:
    """The fewest ranks (same GPUs, same per-node count) with a layout that fits; None if none up to
    MAX_WORLD_SEARCHED."""
    for size in range(world.size + 1, MAX_WORLD_SEARCHED + 1):
        per_node = min(size, world.gpus_per_node)
        if size % per_node:
            continue
        plan = make_plan(info, costs, request, world.with_size(per_node, size // per_node), exact_only=exact_only)
        if plan.recommended is not None:
            return size
    return None


def auto_config(model: str, request: GenerateRequest, world: World,
                compile: str | None = None) -> tuple[ParallelConfig, Prediction]:
    """The planner's layout for --layout auto (exact layouts first; FP8 is never chosen for the user).
    ConfigError naming the smallest world that would fit when none does."""
    _, info, costs = load_model(model)
    plan = make_plan(info, costs, request, world, fp8_options=False)
    if plan.recommended is None:
        smallest = smallest_fitting_world(info, costs, request, world)
        where = (f"the smallest world in which one fits has {smallest} ranks: use --ranks {smallest}"
                 if smallest else f"no world up to {MAX_WORLD_SEARCHED} ranks fits it")
        raise ConfigError(
            f"--layout auto: no layout of {world.size} rank(s) with {world.memory_bytes / 1e9:.1f} GB each fits "
            f"this model and request ({len(plan.rows)} legal layouts, the smallest needs "
            f"{min((r.memory.peak for r in plan.rows), default=0) / 1e9:.1f} GB per rank); {where}, or lower "
            "the size (see `meshdit plan` for the table).")
    return plan.recommended.layout.parallel_config(compile), plan.recommended
