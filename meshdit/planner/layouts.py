"""Every layout of a world: degrees per mesh axis that multiply to the world size, with the VAE decode and FP8
choices, kept only where the model's own pre-launch checks (ModelInfo.check) accept it.

The axes, their order and fields are the axis table's (mesh_axes.AXES); a new axis adds its terms in predict.py."""
from __future__ import annotations

import math
from dataclasses import dataclass, replace

from ..config import MAX_SIDE, GenerateRequest, ParallelConfig
from ..errors import ConfigError
from ..mesh_axes import MESH_AXES, MeshAxis, axis as axis_row, derived_group
from ..models.info import ModelInfo

VAE_TILE_PX = 1024
"""The tile side (pixels) of the tiled decode the planner offers."""
VAE_MODES = ("plain", "parallel", "tiled")
"""plain: the image group's first rank decodes whole; parallel: row bands over the image group (exact);
tiled: the VAE's own tiles on one rank (bounded error)."""


@dataclass(frozen=True)
class Layout:
    degrees: tuple[tuple[MeshAxis, int], ...]
    """(axis, degree) outermost first (mesh_axes.MESH_AXES' order)."""
    vae: str = "plain"
    fp8: bool = False
    """FP8 GEMMs (weights in FP8) and FP8 stale K/V."""
    text_on_cpu: bool = False
    """--text-encoder-device cpu: the text encoders' weights stay in host memory."""
    text_parallel: bool = False
    """--text-encoder-parallel: the text encoders' layers split over every rank."""
    offload: bool = False
    """--offload blocks: the blocks' weights in host memory, two blocks on the device at a time."""
    vae_tile: tuple[int, int] = (VAE_TILE_PX, VAE_TILE_PX)
    """A tiled decode's tile (height, width) in pixels."""

    @classmethod
    def of(cls, config: ParallelConfig, **choices) -> "Layout":
        """The layout of a ParallelConfig's degrees, with the other choices given."""
        return cls(tuple(config.degrees.items()), **choices)

    def degree(self, axis: MeshAxis) -> int:
        return dict(self.degrees).get(MeshAxis(axis), 1)  # a misspelt name fails, as on the mesh

    @property
    def world_size(self) -> int:
        size = 1
        for _, d in self.degrees:
            size *= d
        return size

    @property
    def sp(self) -> int:
        return self.group_size(MeshAxis.SP)

    @property
    def image_group(self) -> int:
        """Ranks that share one image (every axis but data parallelism)."""
        return self.group_size(MeshAxis.IMAGE)

    def group_size(self, group: MeshAxis) -> int:
        """Ranks in one derived group (mesh_axes.DERIVED_GROUPS)."""
        return math.prod(self.degree(a) for a in derived_group(group).axes)

    def parallel_config(self, compile: str | None = None) -> ParallelConfig:
        return ParallelConfig(**{axis_row(axis).field: d for axis, d in self.degrees}, compile=compile)

    def describe(self) -> str:
        """The degrees, and "+ offload" when the blocks wait in host memory."""
        return self.parallel_config().describe() + (" + offload" if self.offload else "")

    def flags(self) -> str:
        """The generate flags that give this layout."""
        out = []
        for axis, d in self.degrees:
            if d == 1:
                continue
            out.append(f"{axis_row(axis).flag_text} {d}")
        if self.vae == "parallel":
            out.append("--use-parallel-vae")
        elif self.vae == "tiled":
            out.append(f"--vae-tile-height {self.vae_tile[0]} --vae-tile-width {self.vae_tile[1]}")
        if self.fp8:
            out += ["--fp8-gemm", "--fp8-stale-kv"] if self.degree(MeshAxis.PP) > 1 else ["--fp8-gemm"]
        if self.text_on_cpu:
            out.append("--text-encoder-device cpu")
        if self.text_parallel:
            out.append("--text-encoder-parallel")
        if self.offload:
            out.append("--offload blocks")
        return " ".join(out)


def layout_of(engine) -> Layout:
    """The layout an EngineSettings runs: its degrees, VAE decode (tiles: their size, the image's side where only one
    is given), FP8 GEMMs, where the text encoders sit, block offload."""
    config, vae, loading = engine.config, engine.vae, engine.loading
    tile = (vae.tile_height or MAX_SIDE, vae.tile_width or MAX_SIDE)
    mode = "parallel" if vae.parallel else "tiled" if vae.tile_height or vae.tile_width else "plain"
    return Layout.of(config, vae=mode, fp8=engine.fp8 is not None and engine.fp8.gemm,
                     text_on_cpu=loading.text_encoder_device == "cpu",
                     text_parallel=bool(loading.text_encoder_parallel), offload=loading.offload == "blocks",
                     vae_tile=tile)


def _allowed(axis: MeshAxis, degree: int) -> bool:
    """The axis table's bound for every model (cfg: the most branches any family runs); ModelInfo.check decides
    the rest."""
    limit = axis_row(axis).max_degree
    return limit is None or degree <= limit


def degree_tuples(world_size: int, axes=MESH_AXES) -> list[tuple[tuple[MeshAxis, int], ...]]:
    """Every assignment of degrees to `axes` whose product is world_size."""
    if not axes:
        return [()] if world_size == 1 else []
    first, rest = axes[0], axes[1:]
    out = []
    for d in range(1, world_size + 1):
        if world_size % d == 0 and _allowed(first, d):
            out += [((first, d),) + tail for tail in degree_tuples(world_size // d, rest)]
    return out


def legal_layouts(info: ModelInfo, request: GenerateRequest, world_size: int, fp8_options: bool = True,
                  parallel_vae: bool = True) -> list[Layout]:
    """Layouts the model accepts for this request (its defaults filled), with and without FP8, each with a plain
    decode and, where its image group has more than one rank, a parallel one (exact, never more memory, faster on
    large images; its halo exchanges and norm all-reduces cost more than they save on small ones: choose.make_plan
    keeps the faster); the planner adds the tiled-decode and text-on-CPU variants only where these do not fit.
    request must have every value resolved (ModelInfo.request_defaults)."""
    images = len(request.prompts) * request.num_images_per_prompt
    out = []
    for degrees in degree_tuples(world_size):
        layout = Layout(degrees)
        config = layout.parallel_config()
        try:
            info.check(config, request.height, request.width, request.guidance_scale, images,
                       request.patches(config), request.num_frames, request.extra)
        except ConfigError:
            continue
        decodes = ("plain", "parallel") if parallel_vae and layout.image_group > 1 else ("plain",)
        for fp8 in ((False, True) if fp8_options else (False,)):
            out += [replace(layout, vae=vae, fp8=fp8) for vae in decodes]
    return out
