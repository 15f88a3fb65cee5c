"""meshdit.parallelize(pipe, ...): meshdit installed on a diffusers pipeline in place, so its own `pipe(...)` runs
over the mesh; meshdit.unparallelize(pipe) takes it all off again.

Every rank runs the same `__call__` with the same arguments and generator, so everything outside the transformer
(text encoders, scheduler, latents, callbacks, image processors) is replicated and equal on every rank. What is
installed:

- on each denoiser (`transformer`, and Wan 2.2's `transformer_2`), by its class's family plan, the strategies of
  meshdit.combine.parallelize: the sequence hooks (Ulysses / Ring / USP: split the inputs, gather the output),
  tensor parallelism, FP8, block offload;
- cfg > 1: the transformer's batch split over the cfg ranks at its input and gathered after (batch_split.py), for
  pipelines that batch their guidance branches; the others are refused with the reason (support.py);
- `vae`: the pipeline's `vae.decode` replaced by the parallel (or tiled) decode (vae_decode.py);
- `cache`: a step cache (meshdit/cache) per `pipe(...)` call, its decisions taken over the sequence group's global
  sums, so every rank takes the same one;
- the pipeline's class swapped for a subclass of the same name whose `__call__` wraps the original (Python looks
  `pipe(...)` up on the class); non-output ranks' progress bars off.
"""
from __future__ import annotations

import atexit
import functools
import weakref
from contextlib import contextmanager
from dataclasses import dataclass, field

from ..cache_settings import CacheSettings
from ..combine.parallelize import denoisers, parallelize as combine_parallelize
from ..config import ParallelConfig
from ..distributed.mesh import ParallelMesh, SingleProcessMesh
from ..errors import ConfigError
from ..mesh_axes import MeshAxis
from ..models.registry import family_for_transformer
from ..vae.settings import UNSPLIT_VAE_REASONS, VaeDecodeSettings
from .batch_split import BatchSplit
from .steps import StepCaches
from .support import SEQUENCE_REFUSED, support_of
from .vae_decode import ParallelDecode

_INSTALLED: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()
_SUBCLASSES: dict[type, type] = {}


@dataclass
class Installed:
    """What parallelize put on one pipeline (pipe_native.installed(pipe) returns it)."""

    mesh: object
    original_class: type
    plan: object
    parallel: object  # combine.parallelized.Parallelized: the hooks on the denoisers
    cache: CacheSettings | None
    rewrites_weights: bool  # tensor parallelism or FP8 GEMMs changed the transformer's weights
    module_counts: list[int]
    progress_config: object
    removers: list = field(default_factory=list)
    cache_report: object = None
    """The last call's cache.step_cache masks: {denoiser index: per call slot, per row, per step: cached}."""


def installed(pipe) -> Installed | None:
    return _INSTALLED.get(pipe)


def _mesh_for(config) -> ParallelMesh | SingleProcessMesh:
    if isinstance(config, (ParallelMesh, SingleProcessMesh)):
        return config
    config = config or ParallelConfig()
    if not isinstance(config, ParallelConfig):
        raise ConfigError(f"meshdit.parallelize takes config= a ParallelConfig or the mesh meshdit.init returned, "
                          f"got {type(config).__name__}.")
    config.validate()
    import torch.distributed as dist

    from ..distributed.mesh import init_distributed, pick_device, teardown_distributed

    if config.world_size == 1:  # this process alone, in a world or not: no group needed
        return SingleProcessMesh(pick_device(), config)
    if not dist.is_initialized():  # a torchrun script that did not call meshdit.init: join the world here
        device = init_distributed()
        atexit.register(teardown_distributed)  # gloo ranks may abort at exit without it
    else:
        device = pick_device()
    return ParallelMesh.build(config, device)


def _vae_settings(vae) -> VaeDecodeSettings | None:
    if vae is None or vae is False:
        return None
    settings = VaeDecodeSettings(parallel=True) if vae is True else vae
    if not isinstance(settings, VaeDecodeSettings):
        raise ConfigError(f"vae= takes True (parallel decode) or a meshdit.vae.VaeDecodeSettings, got {vae!r}.")
    settings.validate()
    return settings if settings.parallel or settings.tiled else None


def _check_layout(pipe, support, family, config: ParallelConfig) -> None:
    name = type(pipe).__name__
    if config.pipefusion_parallel_degree > 1:
        raise ConfigError(f"PipeFusion drives its own loop (patches through stages across steps), so it cannot run "
                          f"inside {name}.__call__: use the Engine's recipe path (meshdit.Engine, meshdit generate) "
                          "or pipefusion_parallel_degree 1.")
    if config.data_parallel_degree > 1:
        raise ConfigError(f"data parallelism splits the prompts before the pipeline runs: call {name} with your "
                          "share of the prompts on each rank group, or use the Engine's recipe path; "
                          "data_parallel_degree 1 here.")
    if config.ulysses_degree * config.ring_degree > 1 and (why := SEQUENCE_REFUSED.get(name)):
        raise ConfigError(f"{name}: {why}; use ulysses_degree and ring_degree 1 for this pipeline.")
    if config.cfg_degree > 1 and (why := support.cfg_refusal()):
        raise ConfigError(why + ".")
    if config.tensor_parallel_degree > 1 and not family.parallel.tensor:
        raise ConfigError(f"{support.transformer_class} has no tensor plan: use tensor_parallel_degree 1 "
                          f"(sequence parallelism runs it).")


def parallelize(pipe, config: ParallelConfig | ParallelMesh | None = None, *, cache: CacheSettings | None = None,
                fp8=None, offload: str | None = None, vae: bool | VaeDecodeSettings | None = None):
    """Installs meshdit on `pipe` in place and returns it; `pipe(...)` then runs over the mesh on every rank.

    config: the degrees (a ParallelConfig; under torchrun the world is joined here if meshdit.init was not
    called), or the mesh meshdit.init returned. cache: a CacheSettings (e.g. CacheSettings("fast")). fp8: an
    Fp8Config. offload: "blocks". vae: True (the parallel decode, exact) or a VaeDecodeSettings (tiles)."""
    if pipe in _INSTALLED:
        raise ConfigError(f"{type(pipe).__name__} is parallelized already: call meshdit.unparallelize(pipe) first.")
    support = support_of(type(pipe))
    if support is None:
        transformer = type(getattr(pipe, "transformer", None)).__name__
        raise ConfigError(f"meshdit has no plan for {type(pipe).__name__}'s transformer ({transformer}): see "
                          "docs/pipelines.md for the pipelines it runs.")
    family = family_for_transformer(type(pipe.transformer).__name__)
    if cache is not None:
        cache.validate()
        cache = cache if cache.enabled else None
    vae_settings = _vae_settings(vae)
    if vae_settings is not None and (why := UNSPLIT_VAE_REASONS.get(type(pipe.vae).__name__)):
        raise ConfigError(f"vae=: meshdit cannot decode {type(pipe.vae).__name__} in parts exactly: {why}; leave "
                          "vae= unset (every rank decodes the whole image).")
    # the layout is checked before any world is joined: a refusal reaches every rank alike, at once
    _check_layout(pipe, support, family, config.config if isinstance(config, (ParallelMesh, SingleProcessMesh))
                  else config or ParallelConfig())
    mesh = _mesh_for(config)
    config = mesh.config
    if mesh.device.type == "cuda" and pipe.device.type == "cuda" and pipe.device != mesh.device:
        pipe.to(mesh.device)  # `pipe.to("cuda")` on every rank put them all on cuda:0: this rank's own GPU
    plan = family.plan()
    if cache is not None:
        cache.check_blocks(sum(len(dict(pipe.transformer.named_modules())[spec.path]) for spec in plan.stages.blocks))
    parallel = combine_parallelize(pipe, plan, mesh, fp8, offload)
    state = Installed(
        mesh, type(pipe), plan, parallel, cache,
        rewrites_weights=config.tensor_parallel_degree > 1 or bool(fp8 is not None and fp8.gemm),
        module_counts=[len(list(t.modules())) for t in parallel.denoisers],
        progress_config=dict(getattr(pipe, "_progress_bar_config", {})) if hasattr(pipe, "_progress_bar_config")
        else None)
    state.removers.append(parallel)
    if config.cfg_degree > 1:
        state.removers += [BatchSplit(t, mesh.group(MeshAxis.CFG)) for t in parallel.denoisers]
    if vae_settings is not None:
        state.removers.append(ParallelDecode(pipe.vae, vae_settings, mesh.group(MeshAxis.IMAGE)))
    if not mesh.is_output_rank:
        pipe.set_progress_bar_config(disable=True)
    pipe.__class__ = _subclass(type(pipe))
    _INSTALLED[pipe] = state
    return pipe


def unparallelize(pipe):
    """Takes off everything parallelize installed (hooks, the SDPA router's hold, the VAE wrapper, the class swap,
    the progress bar setting) and returns `pipe`, as it was. Refused where tensor parallelism or FP8 GEMMs rewrote
    the transformer's weights (reload the pipeline then)."""
    state = _INSTALLED.get(pipe)
    if state is None:
        raise ConfigError(f"{type(pipe).__name__} is not parallelized (meshdit.parallelize was not called on it).")
    if state.rewrites_weights:
        raise ConfigError("tensor parallelism and FP8 GEMMs rewrote the transformer's weights (shards, FP8), which "
                          "meshdit does not keep a copy of: load the pipeline again (from_pretrained) instead of "
                          "unparallelizing it.")
    for remover in reversed(state.removers):
        remover.remove()
    pipe.__class__ = state.original_class
    if state.progress_config is None:
        pipe.__dict__.pop("_progress_bar_config", None)
    else:
        pipe._progress_bar_config = state.progress_config
    del _INSTALLED[pipe]
    return pipe


@contextmanager
def parallelized(pipe, config=None, **options):
    """`with meshdit.parallelized(pipe, config): pipe(...)`: parallelize, then unparallelize on the way out."""
    parallelize(pipe, config, **options)
    try:
        yield pipe
    finally:
        unparallelize(pipe)


def _subclass(cls: type) -> type:
    """cls with a `__call__` that runs the original under this call's step cache; the same name, module and
    qualified name, so diffusers (model_index.json's _class_name, from_pipe) sees the class it knows."""
    if cls not in _SUBCLASSES:
        def __call__(self, *args, **kwargs):
            state = _INSTALLED[self]
            _check_unchanged(state)
            with StepCaches(state) as caches:
                result = cls.__call__(self, *args, **kwargs)
            state.cache_report = caches.report
            return result

        functools.update_wrapper(__call__, cls.__call__)  # its signature and docs: diffusers' own

        _SUBCLASSES[cls] = type(cls.__name__, (cls,), {"__call__": __call__, "__module__": cls.__module__,
                                                       "__qualname__": cls.__qualname__, "__doc__": cls.__doc__})
    return _SUBCLASSES[cls]


def _check_unchanged(state: Installed) -> None:
    """LoRA loaded after parallelize adds peft layers: fine over hooks, not over shards or FP8 weights."""
    counts = [len(list(t.modules())) for t in state.parallel.denoisers]
    if state.rewrites_weights and counts != state.module_counts:
        raise ConfigError("the transformer gained layers after meshdit.parallelize (a LoRA loaded with "
                          "load_lora_weights?), but tensor parallelism / FP8 GEMMs rewrote its Linear layers: load "
                          "the LoRA before meshdit.parallelize.")


__all__ = ["parallelize", "unparallelize", "parallelized", "installed", "denoisers"]

