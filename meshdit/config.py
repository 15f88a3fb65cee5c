"""Parallel layout and generation settings, validated before any rank starts."""
from __future__ import annotations

import math
from dataclasses import dataclass, field, fields, replace

from .errors import ConfigError

# Mesh axes, outermost to innermost (DESIGN.md): Ulysses groups are contiguous
# ranks, ring groups strided, then pipefusion, cfg and data outside them.
MESH_AXES = ("dp", "cfg", "pp", "ring", "ulysses")

# The flag that sets each ParallelConfig field, for messages (cfg_degree is --use-cfg-parallel's 2).
_LAYOUT_FLAGS = {
    "data_parallel_degree": "--data-parallel-degree", "cfg_degree": "cfg degree",
    "pipefusion_parallel_degree": "--pipefusion-parallel-degree", "ring_degree": "--ring-degree",
    "ulysses_degree": "--ulysses-degree", "num_pipeline_patch": "--num-pipeline-patch",
    "warmup_steps": "--warmup-steps",
}
MAX_SIDE = 8192  # pixels; larger sides are refused before anything allocates (a 100000 px side wanted 5 GB)
MAX_SEED = 2**64 - 1  # torch.Generator.manual_seed takes 64 bits


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
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                flag = _LAYOUT_FLAGS.get(f.name, f.name)
                raise ConfigError(f"{flag} must be a whole number >= 1, got {value!r}: use {flag} 1 or more.")
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


@dataclass(frozen=True)
class RequestDefaults:
    """What a model generates when a request leaves a value unset (models/info.py says which model gets what)."""

    height: int
    width: int
    steps: int
    guidance_scale: float
    max_sequence_length: int


@dataclass
class GenerateRequest:
    """One generation: what to draw and how. Fields mirror `meshdit generate` flags.

    Unset (None) values take the model's defaults (Engine.generate, and the CLI, fill them the same way)."""

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

    def with_defaults(self, defaults: RequestDefaults) -> "GenerateRequest":
        """A copy with every unset value taken from `defaults`."""
        extra = dict(self.extra)
        extra.setdefault("max_sequence_length", defaults.max_sequence_length)
        return replace(
            self, height=self.height if self.height is not None else defaults.height,
            width=self.width if self.width is not None else defaults.width,
            num_inference_steps=self.num_inference_steps if self.num_inference_steps is not None else defaults.steps,
            guidance_scale=self.guidance_scale if self.guidance_scale is not None else defaults.guidance_scale,
            extra=extra)

    def validate(self) -> None:
        """Range checks that need no model; each message names the flag and the fix."""
        _check_texts("--prompt", self.prompts, allow_empty=False)
        if self.negative_prompt is not None:
            _check_texts("--negative-prompt", [self.negative_prompt], allow_empty=True)
        _check_int("--steps", self.num_inference_steps, 1, None, "e.g. --steps 20")
        for name in ("height", "width"):
            _check_int(f"--{name}", getattr(self, name), 1, MAX_SIDE,
                       f"image sides are 1..{MAX_SIDE} pixels, e.g. --{name} 1024")
        _check_int("--seed", self.seed, 0, MAX_SEED, f"seeds are 0..2**64-1 ({MAX_SEED})", allow_none=False)
        _check_int("--num-images-per-prompt", self.num_images_per_prompt, 1, None,
                   "each prompt makes at least one image, e.g. --num-images-per-prompt 1", allow_none=False)
        scale = self.guidance_scale
        if scale is not None and (isinstance(scale, bool) or not isinstance(scale, (int, float))
                                  or not math.isfinite(scale)):
            raise ConfigError(f"--guidance-scale must be a finite number, got {scale!r} (inf or nan would write a "
                              "NaN image or silently turn guidance off): use e.g. --guidance-scale 3.5.")
        _check_int("--max-sequence-length", self.extra.get("max_sequence_length"), 1, None,
                   "e.g. --max-sequence-length 256")


def _check_int(flag: str, value, low: int, high: int | None, hint: str, allow_none: bool = True) -> None:
    if value is None and allow_none:
        return
    bounds = f">= {low}" if high is None else f"in {low}..{high}"
    if not isinstance(value, int) or isinstance(value, bool):
        raise ConfigError(f"{flag} must be a whole number {bounds}, got {value!r}: {hint}.")
    if value < low or (high is not None and value > high):
        raise ConfigError(f"{flag} {value} is out of range: it must be {bounds}; {hint}.")


def _check_texts(flag: str, texts: list, allow_empty: bool) -> None:
    if not texts and not allow_empty:
        raise ConfigError(f"{flag}: no prompt given; pass --prompt TEXT or a --prompt-file with one prompt per line.")
    for text in texts:
        if not isinstance(text, str):
            raise ConfigError(f"{flag} must be text, got {text!r}.")
        try:
            text.encode("utf-8")
        except UnicodeEncodeError:  # undecodable argv bytes arrive as lone surrogates
            raise ConfigError(f"{flag} {text!r} is not valid UTF-8 text: pass the prompt in UTF-8.") from None
        if not allow_empty and not text.strip():
            raise ConfigError(f"{flag} {text!r} is blank: give the text to draw, e.g. {flag} 'a red circle'.")
