"""Parallel layout and generation settings, validated before any rank starts."""
from __future__ import annotations

import math
from dataclasses import dataclass, field, fields

from .errors import ConfigError

# Mesh axes, outermost to innermost (DESIGN.md): Ulysses groups are contiguous
# ranks, ring groups strided, then pipefusion, cfg and data outside them.
MESH_AXES = ("dp", "cfg", "pp", "ring", "ulysses")

# Axes whose strategy has not landed yet: refused, never silently ignored.
_NOT_YET_SUPPORTED: dict[str, str] = {}


@dataclass(frozen=True)
class ParallelConfig:
    """Degree of every mesh axis. Their product is the world size."""

    data_parallel_degree: int = 1
    """Prompts (requests) split across this many groups."""
    cfg_degree: int = 1
    """2 runs the conditional and unconditional branches on different ranks."""
    pipefusion_parallel_degree: int = 1
    """Transformer blocks split into this many pipeline stages."""
    ring_degree: int = 1
    """Ring attention: K/V blocks passed around a ring of this many ranks."""
    ulysses_degree: int = 1
    """Ulysses attention: all-to-all between sequence and head shards."""
    num_pipeline_patch: int | None = None
    """PipeFusion: patches the image is cut into along its height (default: the pipefusion degree)."""
    warmup_steps: int = 1
    """PipeFusion: leading steps run on the whole image, without stale K/V (all steps: exact)."""

    @property
    def world_size(self) -> int:
        return math.prod(self.degrees.values())

    @property
    def degrees(self) -> dict[str, int]:
        """Degree per mesh axis name, outermost first."""
        return {
            "dp": self.data_parallel_degree,
            "cfg": self.cfg_degree,
            "pp": self.pipefusion_parallel_degree,
            "ring": self.ring_degree,
            "ulysses": self.ulysses_degree,
        }

    @property
    def patches(self) -> int:
        return self.num_pipeline_patch or self.pipefusion_parallel_degree

    @property
    def sp_degree(self) -> int:
        return self.ring_degree * self.ulysses_degree

    def describe(self) -> str:
        parts = [f"{k}{v}" for k, v in self.degrees.items() if v > 1]
        return " x ".join(parts) if parts else "serial"

    def validate(self, world_size: int | None = None) -> None:
        """Checks that need no model: positive degrees, supported axes, world size."""
        for f in fields(self):
            value = getattr(self, f.name)
            if value is None and f.name == "num_pipeline_patch":
                continue
            if not isinstance(value, int) or value < 1:
                raise ConfigError(f"{f.name} must be a whole number >= 1, got {value!r}.")
        for name, what in _NOT_YET_SUPPORTED.items():
            if getattr(self, name) != 1:
                raise ConfigError(
                    f"{what} is not yet supported by this version of meshdit; "
                    f"remove the option (set {name} = 1) and use --ulysses-degree / --ring-degree."
                )
        if self.cfg_degree not in (1, 2):
            raise ConfigError(f"cfg degree must be 1 or 2 (one rank group per guidance branch), got {self.cfg_degree}.")
        if world_size is not None and world_size != self.world_size:
            raise ConfigError(
                f"The degrees multiply to {self.world_size} ({self._product_text()}) but the world has "
                f"{world_size} ranks. Change the degrees so that their product is {world_size}, "
                f"or launch {self.world_size} ranks."
            )

    def _product_text(self) -> str:
        return " x ".join(f"{k}={v}" for k, v in self.degrees.items())


@dataclass
class GenerateRequest:
    """One generation: what to draw and how. Fields mirror `meshdit generate` flags."""

    prompt: str | list[str] = "a red circle on a white background"
    negative_prompt: str | None = None
    height: int | None = None
    width: int | None = None
    num_inference_steps: int | None = None
    guidance_scale: float | None = None
    seed: int = 0
    num_images_per_prompt: int = 1
    extra: dict = field(default_factory=dict)
    """Extra keyword arguments for the pipeline family's recipe (e.g. max_sequence_length)."""

    @property
    def prompts(self) -> list[str]:
        return [self.prompt] if isinstance(self.prompt, str) else list(self.prompt)
