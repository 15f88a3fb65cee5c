"""A request resolved once: `resolve_request` turns what a user asked for (generate's flags, serve's JSON body, the
Python API's GenerateRequest) plus the model's defaults (ModelInfo.request_defaults) into a ResolvedRequest, the
one type the engine, batching, serve, the cost model and admission take; `batch_key` says which resolved requests
may share a batch. No torch: the CLI resolves before any rank starts.

Which settings are the request's and which the engine's is decided by what can change between two generations on
one loaded engine: everything here can (PipeFusion's warmup steps and patches only re-cut the same stages, a step
cache and the pipeline's extra call arguments are per call, LoRA *weights* are switched with set_adapters); what
needs a reload or another mesh (the layout, dtype, FP8, the adapter *files*) is EngineSettings'.
"""
from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass, fields

from .cache_settings import CacheSettings
from .config import GenerateRequest, ParallelConfig, RequestDefaults
from .errors import ConfigError


@dataclass(frozen=True)
class ResolvedRequest:
    """A GenerateRequest with every default filled in and checked (its fields mean what GenerateRequest's do).
    Made by resolve_request only."""

    prompt: tuple[str, ...]
    negative_prompt: str | None
    height: int
    width: int
    num_inference_steps: int
    guidance_scale: float
    seed: int
    num_images_per_prompt: int
    warmup_steps: int
    num_pipeline_patch: int | None
    kv_drift_correction: bool
    num_frames: int | None
    fps: int | None
    image: object
    cache: CacheSettings
    loras: tuple
    extra: dict  # a copy of the request's, with max_sequence_length filled in; never changed after resolution
    sampler: str | None
    noise_level: float
    return_trajectory: bool
    image_key: str | None = None
    """The input image's SHA-256 (of the file, or of a PIL image's pixels): requests share a batch only with the
    same image."""

    @property
    def prompts(self) -> list[str]:
        return list(self.prompt)

    @property
    def num_images(self) -> int:
        return len(self.prompts) * self.num_images_per_prompt

    def patches(self, config: ParallelConfig) -> int:
        """PipeFusion's patches on this layout: --num-pipeline-patch, else one per stage."""
        return self.num_pipeline_patch or config.pipefusion_parallel_degree

    def validate(self) -> None:
        """The range checks of GenerateRequest (a resolved request passes them)."""
        as_request(self).validate()


def as_request(resolved: ResolvedRequest) -> GenerateRequest:
    """The GenerateRequest that resolves to `resolved` (every value set)."""
    return GenerateRequest(**{f.name: getattr(resolved, f.name) for f in fields(GenerateRequest)})


def fill_defaults(request: GenerateRequest, defaults: RequestDefaults) -> ResolvedRequest:
    """Every unset value of `request` from `defaults`: the one place a request's defaults are filled."""
    extra = dict(request.extra)
    extra.setdefault("max_sequence_length", defaults.max_sequence_length)
    guidance = request.guidance_scale
    if guidance is None:  # FLUX.1, Qwen-Image: true CFG only with a negative prompt, else the plain call's one branch
        alone = defaults.guidance_without_negative_prompt
        guidance = alone if request.negative_prompt is None and alone is not None else defaults.guidance_scale
    values = {f.name: getattr(request, f.name) for f in fields(GenerateRequest)}
    values.update(
        prompt=tuple(request.prompts),  # one prompt or several: the same request
        height=_given(request.height, defaults.height), width=_given(request.width, defaults.width),
        num_inference_steps=_given(request.num_inference_steps, defaults.steps), guidance_scale=guidance,
        # an image model's defaults have no frames: a --num-frames given to it stays, and is refused
        num_frames=_given(request.num_frames, defaults.num_frames), fps=_given(request.fps, defaults.fps),
        loras=tuple(tuple(entry) for entry in request.loras), extra=extra)
    return ResolvedRequest(**values, image_key=image_key(request.image))


def _given(value, default):
    return default if value is None else value


def resolve_request(request: GenerateRequest | ResolvedRequest | str, info, config: ParallelConfig | None = None,
                    num_images: int | None = None, image_per_request: bool = False) -> ResolvedRequest:
    """The one resolution of a request: a prompt (str) or GenerateRequest checked for ranges, its unset values
    taken from `info`'s (ModelInfo) defaults, and, given the layout `config`, checked against the model and layout
    (ModelInfo.check_request; num_images: the images of the batch it runs in, image_per_request: serve's defaults,
    whose requests bring their own image). Raises RequestFieldError naming the field at fault (a plain ConfigError
    where the layout or model alone is at fault)."""
    if isinstance(request, str):
        request = GenerateRequest(prompt=request)
    if isinstance(request, GenerateRequest):
        request.validate()
        resolved = fill_defaults(request, info.request_defaults())
    elif isinstance(request, ResolvedRequest):
        resolved = request
    else:
        raise ConfigError(f"a request is a GenerateRequest or a prompt (str), got {type(request).__name__}: e.g. "
                          "engine.generate(GenerateRequest(prompt='a red circle', num_inference_steps=20)).")
    if config is not None:
        info.check_request(config, resolved, num_images, image_per_request)
    return resolved


def batch_key(request: ResolvedRequest, info, config: ParallelConfig) -> tuple:
    """Which requests may share one batch (one denoising loop): those with equal keys. ((what, value), ...), so a
    refusal can name what differs. Used by Engine.generate_many and serve's queue alike."""
    key = (("size (height, width, num_frames, fps)",
            (request.height, request.width, request.num_frames, request.fps)),
           ("steps", request.num_inference_steps),
           ("guidance (guidance_scale; a negative prompt or none)",
            (request.guidance_scale, request.negative_prompt is None)),  # the guidance branches
           ("their step cache settings (--cache and its options)", request.cache),
           ("the same LoRA adapters and weights (--lora)", request.loras),
           ("input image", request.image_key),  # one batch shares the image's token ids
           ("PipeFusion's --warmup-steps, --num-pipeline-patch and --no-kv-drift-correction",
            (request.warmup_steps, request.patches(config), request.kv_drift_correction)),
           ("extra call arguments (--extra, --max-sequence-length)", _frozen(request.extra)),
           ("sampler, noise_level and return_trajectory",
            (request.sampler, request.noise_level if request.sampler else None, request.return_trajectory)))
    if info.draws_noise_each_step:  # each request keeps its own generator in every step: never shares a batch
        key += ((OWN_NOISE, id(request)),)
    return key


OWN_NOISE = "own noise"


def batch_refusal(requests: list[ResolvedRequest], info, config: ParallelConfig) -> str | None:
    """Why `requests` cannot run as one batch (naming what differs), or None."""
    keys = [dict(batch_key(r, info, config)) for r in requests]
    differ = [what for what in keys[0] if any(k[what] != keys[0][what] for k in keys[1:])]
    if OWN_NOISE in differ:
        return (f"this model's {info.scheduler_class} draws noise from each request's generator in every step, so "
                "requests cannot share a batch: generate them one at a time")
    if differ:
        return f"requests in one batch must share {'; '.join(differ)}: generate them in separate batches"
    return None


def _frozen(value):
    """A hashable, comparable stand-in for a JSON-like value (extra's dicts and lists)."""
    if isinstance(value, dict):
        return tuple(sorted((k, _frozen(v)) for k, v in value.items()))
    if isinstance(value, (list, tuple)):
        return tuple(_frozen(v) for v in value)
    return value


def image_key(image) -> str | None:
    """The SHA-256 of an input image: a file's bytes, or a PIL image's mode, size and pixels."""
    if image is None:
        return None
    if isinstance(image, (str, os.PathLike)):
        try:
            with open(image, "rb") as f:
                return hashlib.sha256(f.read()).hexdigest()
        except OSError:
            return str(image)  # ModelInfo.check_request names the unreadable file
    digest = hashlib.sha256(f"{getattr(image, 'mode', '')}{getattr(image, 'size', '')}".encode())
    digest.update(image.tobytes() if hasattr(image, "tobytes") else repr(image).encode())
    return digest.hexdigest()

