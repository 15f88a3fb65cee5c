"""Parallel layout and generation settings, validated before any rank starts.

Each field that `meshdit generate` sets carries its flag (`flag_spec.flagged`): the flag's name, xDiT's
spelling and the help text are written here once, and `meshdit.flags` builds the command line from them.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from contextlib import contextmanager

from .errors import ConfigError, RequestFieldError
from .cache_settings import CacheSettings
from .default_model import DEFAULT_PROMPT
from .flag_spec import flagged
from .lora_files import MAX_LORA_WEIGHT, check_lora_weight, parse_lora_flag
from .mesh_axes import AXES, MeshAxis, axis, degree_field, derived_group


# torch.compile backends --compile offers (the API takes any registered backend name).
COMPILE_BACKENDS = ("inductor", "aot_eager", "eager")
MAX_SIDE = 8192  # pixels; larger sides are refused before anything allocates (a 100000 px side asks for gigabytes)
MAX_SEED = 2**64 - 1  # torch.Generator.manual_seed takes 64 bits
MAX_STEPS, MAX_FRAMES, MAX_TEXT_TOKENS = 10_000, 10_000, 65_536  # far above any pipeline's; bounded so the cost
# estimates before launch stay finite floats (a 400-digit --steps overflowed them)
SAMPLERS = (None, "flow-sde")  # GenerateRequest.sampler: the scheduler's own step, or Flow-GRPO's SDE step (docs/rl.md)

# The bundled model's own settings, as the help texts quote them (meshdit/default_model/__init__.py).
BUNDLED = "meshdit's bundled model"
PIPEFUSION_WARMUP_COST = (
    "fewer warmup steps than steps leave a bounded error against serial, measured in docs/pipefusion.md; "
    "--warmup-steps equal to --steps gives the serial image exactly")


@dataclass(frozen=True)
class ParallelConfig:
    """Degree of every mesh axis (their product is the world size), and how the transformer runs (compile).

    PipeFusion's run-time settings (warmup steps, patches) are per generation: GenerateRequest's."""

    # One degree per mesh axis, in the mesh's order; flag, help and meaning are the axis table's (mesh_axes.AXES).
    data_parallel_degree: int = degree_field(MeshAxis.DP)
    cfg_degree: int = degree_field(MeshAxis.CFG)
    pipefusion_parallel_degree: int = degree_field(MeshAxis.PP)
    ring_degree: int = degree_field(MeshAxis.RING)
    ulysses_degree: int = degree_field(MeshAxis.ULYSSES)
    tensor_parallel_degree: int = degree_field(MeshAxis.TP)
    compile: str | None = flagged(
        None, flag="compile", aliases=("use-torch-compile", "use_torch_compile"), nargs="?", const="inductor",
        choices=COMPILE_BACKENDS, metavar="BACKEND",
        help="torch.compile each transformer block (regional compilation) with BACKEND, inductor when none is "
             "given; the first generate pays the compilation (docs/compile.md) (default: off, eager)")

    @property
    def world_size(self) -> int:
        return math.prod(self.degrees.values())

    @property
    def degrees(self) -> dict[MeshAxis, int]:
        """Degree per mesh axis, outermost first (the axis table's order)."""
        return {a.name: getattr(self, a.field) for a in AXES}

    @property
    def sp_degree(self) -> int:
        return self.group_size(MeshAxis.SP)

    def group_size(self, group: MeshAxis) -> int:
        """Ranks in one derived group (mesh_axes.DERIVED_GROUPS): sp = ring x ulysses."""
        return math.prod(self.degrees[a] for a in derived_group(group).axes)

    def describe(self) -> str:
        parts = [f"{k}{v}" for k, v in self.degrees.items() if v > 1]
        compiled = f", compiled ({self.compile})" if self.compile else ""
        return (" x ".join(parts) if parts else "serial") + compiled

    def validate(self, world_size: int | None = None) -> None:
        """Checks that need no model: positive degrees, supported axes, world size."""
        if self.compile is not None and (not isinstance(self.compile, str) or not self.compile):
            raise ConfigError(f"--compile takes a torch.compile backend name such as 'inductor', got {self.compile!r}.")
        for a, value in self.degrees.items():
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                flag = axis(a).flag_text
                raise ConfigError(f"{flag} must be a whole number >= 1, got {value!r}: use {flag} 1 or more.")
            limit = axis(a).max_degree
            if limit is not None and value > limit:
                flag = axis(a).flag_text
                raise ConfigError(f"{flag} {value}: {axis(a).max_degree_reason}: use {flag} <= {limit}.")
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
    num_frames: int | None = None
    """Video models: frames per video (None: an image model, which takes no --num-frames)."""
    fps: int | None = None
    """Video models: frames per second the saved video plays at."""
    guidance_without_negative_prompt: float | None = None
    """The guidance an unset --guidance-scale takes when no --negative-prompt is given, where the pipeline runs
    true CFG only with one (FLUX.1, Qwen-Image: 1.0, one branch, as the plain pipeline call); None: guidance_scale."""


@dataclass
class GenerateRequest:
    """One generation: what to draw and how; each field carries its `meshdit generate` flag.

    Unset (None) values take the model's defaults: request.resolve_request fills them, once, for the CLI, serve
    and the API alike (a ResolvedRequest)."""

    prompt: str | list[str] = flagged(
        DEFAULT_PROMPT, flag="prompt", action="extend", nargs="+", metavar="TEXT",
        cli_default=None,  # cli.requested then takes this default: the API's and the CLI's prompt are one
        help="one or more prompts; repeatable: --prompt 'a' 'b' or --prompt 'a' --prompt 'b' "
             "(default: the bundled model's example prompt when neither --prompt nor --prompt-file is given)")
    negative_prompt: str | None = flagged(
        None, flag="negative-prompt", metavar="TEXT",
        help="what to steer away from, with classifier-free guidance (default: empty)")
    height: int | None = flagged(
        None, flag="height", type=int, metavar="H",
        help=f"image height in pixels, 1..8192 and a multiple of the model's patch size "
             f"(default: the model's; {BUNDLED}: 256)")
    width: int | None = flagged(
        None, flag="width", type=int, metavar="W",
        help=f"image width in pixels, like --height (default: the model's; {BUNDLED}: 256)")
    num_inference_steps: int | None = flagged(
        None, flag="steps", aliases=("num-inference-steps", "num_inference_steps"), type=int, metavar="N",
        help=f"denoising steps, >= 1 (default: the model family's, e.g. FLUX.1 28; {BUNDLED}: 20)")
    guidance_scale: float | None = flagged(
        None, flag="guidance-scale", type=float, metavar="G",
        help=f"guidance scale, a finite number; > 1 turns classifier-free guidance on where the model uses it "
             f"(default: the pipeline's, e.g. FLUX.1-dev 3.5, FLUX.1 without a guidance embedding 1; {BUNDLED}: 3.0)")
    seed: int = flagged(
        0, flag="seed", type=int, metavar="S",
        help="random seed of the initial noise, 0..2**64-1; the same seed gives the same image on every "
             "layout (default: 0)")
    num_images_per_prompt: int = flagged(
        1, flag="num-images-per-prompt", type=int, metavar="K", help="images per prompt, >= 1 (default: 1)")
    # PipeFusion's run-time settings are the request's, not the engine's: they re-cut the same stages into patches
    # and choose how stale K/V is used, so they change between generations without reloading (request.py).
    warmup_steps: int = flagged(
        1, flag="warmup-steps", type=int, metavar="K",
        help=f"PipeFusion: leading steps run on the whole image without stale K/V (default: 1; "
             f"{PIPEFUSION_WARMUP_COST})")
    num_pipeline_patch: int | None = flagged(
        None, flag="num-pipeline-patch", type=int, metavar="M",
        help="PipeFusion: patches along the image height (default: the PipeFusion degree)")
    kv_drift_correction: bool = flagged(
        True, flag="no-kv-drift-correction", action="store_true", cli_default=False, to_field=lambda off: not off,
        help="PipeFusion: attend to the later patches' stale values as last computed, as published, instead of "
             "shifted by the mean change this step's fresh patch measured in its own (default: shifted; "
             "docs/pipefusion.md)")
    num_frames: int | None = flagged(
        None, flag="num-frames", type=int, metavar="F",
        help="video models: frames per video, >= 1; the VAE may need a particular count (Wan: 4k + 1) "
             "(default: the model family's, e.g. Wan 81)")
    fps: int | None = flagged(
        None, flag="fps", type=int, metavar="FPS",
        help="video models: frames per second of the saved video, >= 1 (default: the model family's, e.g. Wan 16)")
    image: object = flagged(  # a path; the Python API may pass a PIL image
        None, flag="image", metavar="PATH",
        help="an image file (PNG, JPEG, WebP) for the models that take one: image-to-video models animate it as "
             "the first frame, image-edit models (FLUX.1 Kontext, Qwen-Image-Edit) edit it; sides up to 8192 "
             "pixels and 4096 x 4096 pixels in all, resized by the pipeline (default: none; FLUX.1 Kontext then "
             "draws from text alone)")
    cache: CacheSettings = field(default_factory=CacheSettings)
    """Step caching (`--cache` and its options: meshdit/cache_settings.py); off by default. The request's: hooks
    installed per generation (cache/run.py), so it changes between requests without reloading."""
    loras: tuple = flagged(
        (), flag="lora", action="append", type=parse_lora_flag, metavar="PATH[:WEIGHT]", cli_default=None,
        to_field=lambda given: tuple(given or ()),
        help="a LoRA adapter (diffusers' .safetensors file) and its weight (default 1.0); repeatable: the adapters "
             "add up (default: none; docs/lora.md)")
    """((adapter name or file, weight), ...): the LoRA adapters this request runs with. The weights are the request's
    (set_adapters switches them per request); the files are EngineSettings.loras' (loaded when the engine is built:
    a new file would be a reload)."""
    extra: dict = field(default_factory=dict)
    """Extra keyword arguments for the pipeline family's recipe (e.g. max_sequence_length): per call, so the
    request's."""
    sampler: str | None = None
    """None: the scheduler's own step; "flow-sde": Flow-GRPO's SDE step with per-step log-probs (flow-matching
    families; each image's noise from its own seed: docs/rl.md)."""
    noise_level: float = 0.7
    """flow-sde: the SDE's noise level (Flow-GRPO's `noise_level`; its std is sqrt(sigma / (1 - sigma)) times it)."""
    return_trajectory: bool = False
    """flow-sde: each GenerateResult carries its images' meshdit.rl.trajectory.Trajectory (latents, timesteps,
    noise drawn and log-probs of every step)."""

    @property
    def prompts(self) -> list[str]:
        return [self.prompt] if isinstance(self.prompt, str) else list(self.prompt)

    def patches(self, config: ParallelConfig) -> int:
        """PipeFusion's patches on this layout: --num-pipeline-patch, else one per stage."""
        return self.num_pipeline_patch or config.pipefusion_parallel_degree

    def validate(self) -> None:
        """Range checks that need no model; each message names the flag and the fix, and each error the field
        (RequestFieldError.field: serve's 400 names it)."""
        with field_errors("prompt"):
            _check_texts("--prompt", self.prompts, allow_empty=False)  # a blank prompt is taken, as diffusers does
        with field_errors("loras"):
            for entry in self.loras:
                if not (isinstance(entry, (tuple, list)) and len(entry) == 2 and isinstance(entry[0], str)
                        and check_lora_weight(entry[1])):
                    raise ConfigError(f"--lora: each adapter is (name or file, weight), the weight a finite number "
                                      f"in -{MAX_LORA_WEIGHT:g}..{MAX_LORA_WEIGHT:g} (larger ones overflow the image "
                                      f"to NaN), got {entry!r}")
        if self.negative_prompt is not None:
            with field_errors("negative_prompt"):
                _check_texts("--negative-prompt", [self.negative_prompt], allow_empty=True)
        with field_errors("num_inference_steps"):
            _check_int("--steps", self.num_inference_steps, 1, MAX_STEPS, "e.g. --steps 20")
        for name in ("height", "width"):
            with field_errors(name):
                _check_int(f"--{name}", getattr(self, name), 1, MAX_SIDE,
                           f"image sides are 1..{MAX_SIDE} pixels, e.g. --{name} 1024")
        with field_errors("num_frames"):
            _check_int("--num-frames", self.num_frames, 1, MAX_FRAMES, "e.g. --num-frames 81")
        with field_errors("fps"):
            _check_int("--fps", self.fps, 1, None, "e.g. --fps 16")
        with field_errors("seed"):
            _check_int("--seed", self.seed, 0, MAX_SEED, f"seeds are 0..2**64-1 ({MAX_SEED})", allow_none=False)
        with field_errors("num_images_per_prompt"):
            _check_int("--num-images-per-prompt", self.num_images_per_prompt, 1, None,
                       "each prompt makes at least one image, e.g. --num-images-per-prompt 1", allow_none=False)
        scale = self.guidance_scale
        if scale is not None and (isinstance(scale, bool) or not isinstance(scale, (int, float))
                                  or not math.isfinite(scale)):
            raise RequestFieldError(
                "guidance_scale", f"--guidance-scale must be a finite number, got {scale!r} (inf or nan would write a "
                "NaN image or silently turn guidance off): use e.g. --guidance-scale 3.5.")
        with field_errors("extra"):
            if not isinstance(self.extra, dict):
                raise ConfigError(f"extra must be a dict of pipeline call arguments, got {self.extra!r}.")
            _check_int("--max-sequence-length", self.extra.get("max_sequence_length"), 1, MAX_TEXT_TOKENS,
                       "e.g. --max-sequence-length 256")
        for flag, name in (("--warmup-steps", "warmup_steps"), ("--num-pipeline-patch", "num_pipeline_patch")):
            value = getattr(self, name)
            with field_errors(name):
                if value is not None and (not isinstance(value, int) or isinstance(value, bool) or value < 1):
                    raise ConfigError(f"{flag} must be a whole number >= 1, got {value!r}: use {flag} 1 or more.")
                _check_int(flag, value, 1, MAX_STEPS, f"e.g. {flag} 1")
        with field_errors("cache"):
            if not isinstance(self.cache, CacheSettings):
                raise ConfigError(f"cache must be a CacheSettings (meshdit.cache), got {self.cache!r}.")
            self.cache.validate()
        with field_errors("sampler"):
            if self.sampler not in SAMPLERS:
                raise ConfigError(f"sampler must be one of {SAMPLERS}, got {self.sampler!r}.")
            if self.sampler is not None and (isinstance(self.noise_level, bool) or not isinstance(
                    self.noise_level, (int, float)) or not math.isfinite(self.noise_level) or self.noise_level <= 0):
                raise ConfigError(f"noise_level must be a finite number > 0, got {self.noise_level!r}: e.g. 0.7.")
            if self.return_trajectory is not False and (self.return_trajectory is not True or self.sampler is None):
                raise ConfigError(f"return_trajectory={self.return_trajectory!r}: a trajectory is recorded by "
                                  "sampler='flow-sde' only; pass sampler='flow-sde' with return_trajectory=True.")
        if not isinstance(self.kv_drift_correction, bool):
            raise RequestFieldError("kv_drift_correction", f"kv_drift_correction must be True or False, got "
                                                           f"{self.kv_drift_correction!r}.")


@contextmanager
def field_errors(name: str):
    """A ConfigError raised inside becomes a RequestFieldError naming the request's field `name` (kept if it
    already names one)."""
    try:
        yield
    except RequestFieldError:
        raise
    except ConfigError as exc:
        raise RequestFieldError(name, str(exc)) from None


def _check_int(flag: str, value, low: int, high: int | None, hint: str, allow_none: bool = True) -> None:
    if value is None and allow_none:
        return
    bounds = f">= {low}" if high is None else f"in {low}..{high}"
    if not isinstance(value, int) or isinstance(value, bool):
        raise ConfigError(f"{flag} must be a whole number {bounds}, got {value!r}: {hint}.")
    if value < low or (high is not None and value > high):
        raise ConfigError(f"{flag} {value} is out of range: it must be {bounds}; {hint}.")


def blank_prompts_note(prompts: list) -> str | None:
    """A blank prompt is encoded as diffusers does (unconditional generation): said once, not refused."""
    blank = [p for p in prompts if isinstance(p, str) and not p.strip()]
    if blank:
        return (f"--prompt {blank[0]!r} is blank: the model draws without a text condition (unconditional "
                "generation, as diffusers encodes an empty prompt)")
    return None


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

