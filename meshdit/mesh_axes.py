"""The mesh axes in one table: each axis's name, its place in the mesh, its flag, its ParallelConfig field, what it
splits and its largest degree, and the process groups derived from several axes (no torch).

Everything else reads this table: ParallelConfig's degree fields (`degree_field`) and so the `meshdit generate` /
`serve` flags and their help, ParallelConfig's checks and messages, the DeviceMesh's dims and flattened groups
(distributed/mesh.py), the planner's layouts (planner/layouts.py), and every mesh lookup, which names an axis by
its `MeshAxis` member, never by a string. A new axis is one `Axis` row here (its place in AXES is its place in the
mesh), one `degree_field` line in ParallelConfig, its strategy's code and its planner terms.
"""
from __future__ import annotations

from dataclasses import dataclass
from enum import Enum
from typing import Any

from .flag_spec import flagged


class MeshAxis(str, Enum):
    """The names of the mesh's axes and of the groups derived from them; pass the member, not its string, to a
    mesh lookup (`mesh.group(MeshAxis.PP)`). A str, so it is also a DeviceMesh dim name."""

    DP = "dp"
    CFG = "cfg"
    PP = "pp"
    RING = "ring"
    ULYSSES = "ulysses"
    TP = "tp"
    SP = "sp"
    """Derived: ring x ulysses (DERIVED_GROUPS)."""
    IMAGE = "image"
    """Derived: every axis but dp (DERIVED_GROUPS)."""

    def __str__(self) -> str:
        return self.value


MAX_CFG_DEGREE = 4  # guidance branches per step in any family (CFG 2; SD3's skip-layer guidance 3; guiders up to 4)


@dataclass(frozen=True)
class Axis:
    """One mesh axis: one DeviceMesh dim, one ParallelConfig degree field, one flag."""

    name: MeshAxis
    field: str
    """ParallelConfig's degree field."""
    flag: str
    """The flag without its dashes (kebab-case; xDiT's underscore spelling is added by `meshdit.flags`)."""
    splits: str
    """What the axis's ranks divide among them."""
    metavar: str
    help: str
    """The flag's help, stating its default."""
    switches: tuple[tuple[str, Any, str], ...] = ()
    """Flags without a value that set the degree (flag_spec.FlagSpec.switches)."""
    max_degree: int | None = None
    """A bound that holds for every model (the model's own bounds are ModelInfo.check's)."""
    max_degree_reason: str = ""

    @property
    def flag_text(self) -> str:
        """How a message names the flag: `--ulysses-degree`."""
        return f"--{self.flag}"


@dataclass(frozen=True)
class DerivedGroup:
    """A process group over several axes, flattened into one DeviceMesh dim when the mesh is built."""

    name: MeshAxis
    axes: tuple[MeshAxis, ...]
    """Its axes, in mesh order."""
    means: str


# Outermost first: the order of the DeviceMesh's dims (DESIGN.md). tp innermost (contiguous ranks), since it sends
# the most (two all-reduces of the whole activation per block, none of it overlapped) and contiguous ranks share the
# fastest links (one host, one switch); then Ulysses groups, ring groups strided, then pipefusion, cfg and data
# outside them (xDiT's order: tp, sp, pp, cfg, dp).
AXES: tuple[Axis, ...] = (
    Axis(MeshAxis.DP, "data_parallel_degree", "data-parallel-degree",
         splits="the batch: the images (prompts x images per prompt)", metavar="D",
         help="split the images (prompts x images per prompt) over D rank groups (default: 1)"),
    Axis(MeshAxis.CFG, "cfg_degree", "cfg-degree",
         splits="the guidance branches of each step, dealt round-robin", metavar="D",
         help=f"CFG parallelism: the guidance branches of each step dealt round-robin over D rank groups, D = 1.."
              f"{MAX_CFG_DEGREE}, at most the request's branches: 2 with classifier-free guidance (every family "
              "not guidance-distilled, at guidance > 1), 3 with SD3's skip-layer guidance (--extra "
              "skip_guidance_layers=[...]), 1 on guidance-distilled models (FLUX.1-dev, FLUX.2); docs/layouts.md "
              "(default: 1)",
         switches=(("use-cfg-parallel", 2, "the same as --cfg-degree 2, xDiT's switch (default: off)"),),
         max_degree=MAX_CFG_DEGREE,
         max_degree_reason=f"no family runs more than {MAX_CFG_DEGREE} guidance branches per step (one rank group "
                           "per branch at most)"),
    Axis(MeshAxis.PP, "pipefusion_parallel_degree", "pipefusion-parallel-degree",
         splits="the transformer blocks, in pipeline stages that image patches stream through", metavar="P",
         help="PipeFusion: transformer blocks in P pipeline stages over image patches, with one-step-stale "
              "K/V after the warmup steps (approximate; default: 1, off)"),
    Axis(MeshAxis.RING, "ring_degree", "ring-degree",
         splits="the sequence (tokens); K/V blocks passed around the ring", metavar="R",
         help="ring attention: K/V blocks passed around R ranks (default: 1)"),
    Axis(MeshAxis.ULYSSES, "ulysses_degree", "ulysses-degree",
         splits="the sequence (tokens), exchanged for the heads in attention", metavar="U",
         help="Ulysses sequence parallelism: all-to-all between sequence and head shards; at most the model's "
              "attention heads (default: 1)"),
    Axis(MeshAxis.TP, "tensor_parallel_degree", "tensor-parallel-degree",
         splits="the weights: each block's attention heads and MLP hidden (its Linears)", metavar="T",
         help="tensor parallelism: each transformer block's attention heads and MLP split over T ranks, two "
              "all-reduces per block; cuts weight memory per rank (docs/tensor-parallel.md) (default: 1)"),
)

DERIVED_GROUPS: tuple[DerivedGroup, ...] = (
    DerivedGroup(MeshAxis.SP, (MeshAxis.RING, MeshAxis.ULYSSES), "the ranks that share one sequence"),
    DerivedGroup(MeshAxis.IMAGE, (MeshAxis.CFG, MeshAxis.PP, MeshAxis.RING, MeshAxis.ULYSSES, MeshAxis.TP),
                 "the ranks that make the same images (every axis but dp)"),
)

MESH_AXES: tuple[MeshAxis, ...] = tuple(a.name for a in AXES)
"""The DeviceMesh's dims, outermost first."""
_BY_NAME = {a.name: a for a in AXES}
_DERIVED_BY_NAME = {g.name: g for g in DERIVED_GROUPS}


def axis(name: str) -> Axis:
    """The row of a mesh axis (a MeshAxis or its name; a derived group's name is refused: it has no degree)."""
    return _BY_NAME[MeshAxis(name)]


def derived_group(name: str) -> DerivedGroup:
    return _DERIVED_BY_NAME[MeshAxis(name)]


def degree_field(name: MeshAxis) -> Any:
    """ParallelConfig's degree field of an axis, with its flag from the table: `ulysses_degree: int =
    degree_field(MeshAxis.ULYSSES)`."""
    row = axis(name)
    return flagged(1, flag=row.flag, type=int, metavar=row.metavar, help=row.help, switches=row.switches)
