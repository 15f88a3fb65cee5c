"""Engine: one pipeline, parallelized over a mesh, generating images from requests."""
from __future__ import annotations

import logging
import time
import warnings
from contextlib import contextmanager
from dataclasses import dataclass, field

import numpy as np
import torch

from .config import GenerateRequest, ParallelConfig
from .engine_settings import EngineSettings, check_lora_layout
from .errors import ConfigError
from .lora_files import adapters_for_experts
from .mesh_axes import MeshAxis
from .distributed.mesh import ParallelMesh, SingleProcessMesh
from .loading.options import LoadOptions
from .models.info import ModelInfo
from .combine.parallelize import parallelize
from .phases import reached
from .prompt_vocabulary import PromptVocabulary, UnknownWordsWarning
from .request import ResolvedRequest, batch_refusal, resolve_request
from .denoising.batching import concat_states
from .rl.rollout import add_sample_seeds, attach_sampler, check_sampler
from .rl.trajectory import Trajectory
from .vae import VaeDecodeSettings, decodes_here


OUTPUT_TYPES = ("np", "pil", "pt")
"""What generate's output_type takes: the pipeline's image (video) processor's output types, without diffusers'
"latent"."""


@dataclass
class GenerateResult:
    images: object  # what the pipeline's processor returns for output_type: np.ndarray [N, H, W, 3] (videos:
    # [N, F, H, W, 3]) or PIL
    seconds: dict[str, float] = field(default_factory=dict)  # prepare / denoise / decode
    device: str = "cpu"  # where this rank ran it, e.g. "cuda:0"
    cache: object = None  # meshdit.cache.run.CacheReport of this request's images (None: no --cache)
    trajectory: object = None  # meshdit.rl.trajectory.Trajectory of its images (return_trajectory=True only)


def engine_device(mesh: ParallelMesh | None, device=None) -> torch.device:
    """Where Engine.from_pretrained loads: the mesh's device; without a mesh the `device` asked for, else the
    GPU where one is visible (CUDA or ROCm: cuda:<current>), as diffusers users would `.to("cuda")`, else CPU."""
    if mesh is not None:
        if device is not None and torch.device(device) != mesh.device:
            raise ConfigError(f"device={device!r} differs from the mesh's {mesh.device}: a mesh decides each rank's "
                              "device; drop device=.")
        return mesh.device
    if device is not None:
        return torch.device(device)
    if torch.cuda.is_available():
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


class Engine:
    """Runs a diffusers pipeline through meshdit's loop, over `mesh` (a one-rank mesh when none is given).

    NOTE: with a mesh of several ranks, every rank must call generate() with the same
    request: the ranks cooperate on each transformer call.
    """

    def __init__(self, pipe, mesh: ParallelMesh | None = None, vae: VaeDecodeSettings | None = None, fp8=None,
                 loras: dict[str, str] | None = None, lora_experts: dict[str, tuple[str, ...]] | None = None,
                 offload: str | None = None) -> None:
        """loras: LoRA adapters to load, name -> file (requests choose among them: GenerateRequest.loras).
        lora_experts: name -> the denoisers that adapter loads into, where not ("transformer",) (Wan 2.2's second
        expert: ("transformer_2",), or both). offload: "blocks" keeps the blocks' weights in host memory between
        uses (--offload blocks)."""
        self.pipe = pipe
        self.mesh = mesh if mesh is not None else SingleProcessMesh(pipe.transformer.device)
        self.vae = vae or VaeDecodeSettings()
        self.vae.validate()
        if getattr(pipe, "vae", None) is not None:  # the CLI's refusal (SANA's DC-AE, ...), before any hook
            from .vae.settings import check_vae_class

            check_vae_class({**pipe.vae.config, "_class_name": type(pipe.vae).__name__}, self.vae)
        self.info = ModelInfo.from_pipeline(pipe)
        self.recipe = self.info.make_recipe(pipe)
        self.info.check_layout(self.mesh.config)  # the CLI's ConfigError, before any hook is installed
        self.adapters = dict(loras or {})  # name -> file
        self.adapter_experts = dict(lora_experts or {})  # name -> denoisers, where not the first alone
        self._held: set[str] = set()  # the adapters with tensors on this rank (PipeFusion: this stage's blocks)
        self.adapter_tensors: dict[str, int] = {}  # name -> its tensors held on this rank
        self._active: tuple = ()  # the (name, weight) pairs now set
        if self.adapters:  # before any hook: a hook on a Linear layer must see its adapted output
            self._load_adapters(fp8)
        if offload and self.mesh.config.compile:
            raise ConfigError("--offload blocks with --compile: drop one of them.")
        self._parallel = parallelize(pipe, self.info.family.plan(), self.mesh, fp8, offload)
        self._vocabulary = PromptVocabulary.of_model(self.info.source)  # None unless the folder ships one
        self._warned_words: set[str] = set()

    @classmethod
    def from_pretrained(cls, model: str | None = None, mesh: ParallelMesh | None = None, torch_dtype=None,
                        vae: VaeDecodeSettings | None = None, show_progress: bool = False,
                        loading=None, fp8=None, device=None, verbose: bool = False, loras=(),
                        loras_2=()) -> "Engine":
        """`model`: a pipeline folder or Hub id; None: meshdit's bundled model (with its own size, steps and
        guidance as request defaults). Loading progress bars show only with show_progress=True.
        `loading`: LoadOptions (memory-efficient load, text-encoder placement); `fp8`: Fp8Config.
        `device` (no mesh only): e.g. "cpu" or "cuda:1"; unset, a visible GPU, else the CPU (engine_device);
        `engine.device` and each GenerateResult.device say which. Unless verbose, library warnings stay quiet
        as in `meshdit generate`. `loras`: LoRA adapter files to load (requests name them by file stem or path);
        `loras_2`: adapter files for Wan 2.2's second expert (transformer_2; a file in both loads into both).
        A model that is not there is one ConfigError naming it, agreed over the mesh.
        The same as `from_settings(EngineSettings(...), mesh)`, which the CLI's ranks call."""
        if model is None:
            from .default_model import weights_path

            model = str(weights_path())
        adapters, experts = adapters_for_experts(list(loras), list(loras_2))
        settings = EngineSettings(model, mesh.config if mesh is not None else ParallelConfig(),
                                  EngineSettings.dtype_name(torch_dtype), vae or VaeDecodeSettings(),
                                  loading or LoadOptions(), fp8, verbose, adapters, experts)
        return cls.from_settings(settings, mesh, device, show_progress or verbose)

    @classmethod
    def from_settings(cls, settings: EngineSettings, mesh: ParallelMesh | None = None, device=None,
                      show_progress: bool | None = None) -> "Engine":
        """The engine `settings` describe, on `mesh` (whose layout is settings.config; None: one process on
        `device`, see from_pretrained). Every engine setting is applied here, for `meshdit generate`,
        `meshdit serve` and the Python API alike. show_progress: loading bars (default: settings.verbose)."""
        from .loading.entry import load_pipeline
        from .logs import quiet_libraries
        from .rank_errors import agreed

        quiet_libraries(settings.verbose)
        settings.validate()  # the CLI's refusals, for API users too
        infos = []
        agreed(lambda: infos.append(ModelInfo.from_pretrained(settings.model)), mesh)  # before any weight is read
        device = engine_device(mesh, device)
        if mesh is None:
            logging.getLogger("meshdit").info("meshdit: running %s on %s", settings.model, device)
        # a pipeline that takes an input image encodes it with the VAE on every rank (each prepares its request)
        group = mesh.group(MeshAxis.IMAGE) if mesh is not None else None
        vae_here = decodes_here(settings.vae, group) or infos[0].takes_image
        fp8 = settings.fp8 if settings.fp8 else None
        with _progress_bars(settings.verbose if show_progress is None else show_progress):
            pipe = load_pipeline(settings.model, device, settings.torch_dtype(), mesh, settings.loading,
                                 vae_here=vae_here,
                                 # under tp the shards are quantized after the split, with LoRA after the adapters
                                 # wrap the Linear layers (combine/parallelize)
                                 fp8_gemm=fp8 is not None and fp8.gemm and settings.config.tensor_parallel_degree == 1
                                 and not settings.loras)
        return cls(pipe, mesh, settings.vae, fp8, dict(settings.loras), dict(settings.lora_experts),
                   settings.loading.offload)

    @property
    def device(self) -> torch.device:
        """Where this rank runs the pipeline."""
        return self.mesh.device

    def resolve(self, request: GenerateRequest | str) -> ResolvedRequest:
        """The request with unset values from this model's defaults: request.resolve_request, as `meshdit generate`
        and serve resolve theirs."""
        return resolve_request(_as_request(request), self.info)

    def check(self, request: GenerateRequest | ResolvedRequest, num_images: int | None = None) -> ResolvedRequest:
        """The request resolved and checked against this model and layout, with the CLI's checks before launch
        (the VAE config's too); ConfigError (RequestFieldError naming the field) if it cannot run."""
        resolved = resolve_request(_as_request(request), self.info, self.mesh.config, num_images)
        vae = getattr(self.pipe, "vae", None)
        if vae is not None and (self.vae.parallel or self.vae.tiled):
            from .vae.settings import check_vae_config

            check_vae_config({**vae.config, "_class_name": type(vae).__name__}, self.vae, resolved.height,
                             resolved.width)
        return resolved

    @torch.inference_mode()
    def generate(self, request: GenerateRequest | str, output_type: str = "np", show_progress: bool = False,
                 on_step=None) -> GenerateResult:
        """request: a GenerateRequest, or a prompt alone (every other value the model's default).
        on_step(step, total) -> bool is called on every rank before each step; if it returns True on
        any rank, every rank stops at that step (GenerationCancelled), agreed through the mesh."""
        return self.generate_many([request], output_type, show_progress, on_step)[0]

    @torch.inference_mode()
    def generate_many(self, requests: list[GenerateRequest], output_type: str = "np", show_progress: bool = False,
                      on_step=None) -> list[GenerateResult]:
        """Requests with the same size, steps, guidance and PipeFusion settings run as one batch (split over dp); each request's
        images are its own seed's, as if it ran alone. One result per request."""
        if self._parallel is None:
            raise RuntimeError("this Engine was closed; make a new one to generate")
        if output_type not in OUTPUT_TYPES:  # diffusers' "latent" would return the decoded pixels here
            raise ConfigError(f"output_type={output_type!r}: the engine returns decoded images, as one of "
                              f"{', '.join(map(repr, OUTPUT_TYPES))}; it does not keep latents (no 'latent')")
        requests = [self.resolve(r) for r in requests]
        self._warn_unknown_words([p for r in requests for p in r.prompts])
        refused = batch_refusal(requests, self.info, self.mesh.config)
        if refused:
            raise ConfigError(refused)
        # The data-parallel split needs enough images in the whole batch, not in each request.
        total = sum(r.num_images for r in requests)
        requests = [self.check(r, num_images=total) for r in requests]
        check_sampler(requests, self.info.scheduler_class, self.recipe, self.mesh.config)
        self._use_adapters(self._adapters_of(requests[0]))
        parallel, seconds, start = self._parallel, {}, time.perf_counter()
        states, counts = self._prepare(requests)
        state = parallel.share(self.recipe, concat_states(self.recipe, states))
        sampler = attach_sampler(state, self.pipe.scheduler, requests[0]) if requests[0].sampler else None
        seconds["prepare"] = time.perf_counter() - start
        latents = parallel.denoise(self.recipe, state, requests[0], show_progress,
                                   parallel.agreed(on_step, self.mesh.device), total_images=sum(counts))
        seconds["denoise"] = time.perf_counter() - start - seconds["prepare"]
        reached("decoding")
        # [B, 3, H, W] in [-1, 1] on every rank of the image group; decode_latents runs only where the VAE does
        image = parallel.decode(self.pipe.vae, lambda: self.recipe.decode_latents(state, latents), self.vae,
                                self.mesh.device, **self.recipe.vae_decode_kwargs(state))
        image = parallel.gather(image, sum(counts))  # every rank: all images of the batch
        images = self.recipe.postprocess(image, output_type)  # np: [N, H, W, 3], videos [N, F, H, W, 3]
        seconds["decode"] = time.perf_counter() - start - seconds["prepare"] - seconds["denoise"]
        seconds["total"] = time.perf_counter() - start
        offsets = np.cumsum([0] + counts)
        report = parallel.cache_report
        trajectories = [None] * len(requests)
        if requests[0].return_trajectory:
            record = parallel.collect(sampler.recorded(), sum(counts))
            trajectories = Trajectory(record["latents"], record["noise"], record["log_probs"], state.timesteps,
                                      sampler.sigmas, sampler.noise_level, requests, counts).split()
        return [GenerateResult(images[a:b], dict(seconds), str(self.mesh.device),
                               None if report is None else report.of_images(range(a, b)), trajectory)
                for a, b, trajectory in zip(offsets[:-1], offsets[1:], trajectories)]

    def _prepare(self, requests: list[GenerateRequest]) -> tuple[list, list[int]]:
        """Each request's prepared state (flow-sde: with its images' sample seeds) and its image count."""
        # Noise is drawn on the CPU from the seed, so every rank and every layout starts from the same latents.
        states = [self.recipe.prepare(r, torch.Generator("cpu").manual_seed(r.seed), self.mesh.device)
                  for r in requests]
        if requests[0].sampler:
            states = [add_sample_seeds(s, r) for s, r in zip(states, requests)]
        return states, [s.batch_size for s in states]

    def log_probs(self, trajectory, grad: bool = False, steps=None) -> torch.Tensor:
        """Every step's log-prob of `trajectory` (a Trajectory, or a list of them replayed as one batch) under the
        current weights: [N, T], or [N, len(steps)] for the chosen steps only. The same loop as the rollout, fed
        the recorded latents (teacher forcing), so with unchanged weights it equals the rollout's log-probs bit for
        bit when the batch is the same and on one process, within the layouts' bound otherwise (docs/rl.md).
        grad=True (one process): autograd through the transformer, for a trainer's backward; steps (one process):
        only those steps run (e.g. one at a time, to backpropagate step by step).
        NOTE: with a mesh of several ranks, every rank calls it with the same trajectory."""
        from contextlib import nullcontext

        from .denoising.loop import advance, guided_prediction
        from .parallel.cfg import BranchExchange

        if self._parallel is None:
            raise RuntimeError("this Engine was closed; make a new one to replay")
        if isinstance(trajectory, (list, tuple)):
            trajectory = Trajectory.join(list(trajectory))
        if (grad or steps is not None) and self.mesh.config.world_size > 1:
            raise ConfigError("log_probs(grad=True or steps=...) runs on one process: replay on an engine without a "
                              "mesh (a trainer's own copy of the model), or drop grad and steps.")
        requests = trajectory.requests
        self._use_adapters(self._adapters_of(requests[0]))
        with torch.inference_mode(not grad):
            with torch.no_grad():
                states, _ = self._prepare(requests)
            state = concat_states(self.recipe, states)
            if not torch.equal(state.timesteps.cpu(), trajectory.timesteps.cpu()):
                raise ConfigError("this trajectory's timesteps differ from its requests' on this model: replay it on "
                                  "the model (and scheduler) that made it.")
            recorded = trajectory.latents.to(self.mesh.device).clone()  # [N, T + 1, ...]; clone: a tensor autograd takes
            state.latents = recorded[:, 0]
            state.extra["replay_latents"] = recorded
            state = self._parallel.share(self.recipe, state)
            sampler = attach_sampler(state, self.pipe.scheduler, requests[0], state.extra.pop("replay_latents"))
            with torch.enable_grad() if grad else nullcontext():
                if steps is None:
                    self._parallel.denoise(self.recipe, state, requests[0], total_images=trajectory.num_images)
                else:
                    exchange = BranchExchange(state.branch_names, None)
                    for i in steps:
                        sampler.index = i
                        noise_pred = guided_prediction(self.recipe, state, i, state.timesteps[i], sampler.replay[:, i],
                                                       state.branch_names, exchange)
                        advance(self.recipe, state, noise_pred, state.timesteps[i], sampler.replay[:, i])
            if grad or self.mesh.config.world_size == 1:
                return torch.stack(sampler.log_probs, 1)
            return self._parallel.collect(sampler.recorded(), trajectory.num_images)["log_probs"]

    def update_weights(self, weights, adapter: str | None = None, denoiser: str = "transformer") -> int:
        """New weights for the transformer without a restart: a state dict, a .safetensors path or an iterable of
        (name, tensor), whole tensors named as in the transformer's state dict. Each rank keeps its layout (its
        PipeFusion stage, tp shards, FP8 form, dtypes: meshdit/rl/weights.py), and generation then equals a fresh
        engine loaded with those weights, bit for bit. adapter: the tensors are a LoRA file's for that loaded
        adapter (the base weights stay). denoiser: "transformer_2" for Wan 2.2's second expert. Returns the tensors
        this rank holds of them. NOTE: every rank of the mesh calls it with the same weights."""
        from .rl.weights import named_tensors, update_transformer

        if self._parallel is None:
            raise RuntimeError("this Engine was closed; make a new one")
        if self._parallel.offload:
            raise ConfigError("update_weights with --offload blocks: the offload keeps its own copies of the blocks' "
                              "weights; build the engine without offload.")
        if adapter is not None and adapter not in self.adapters:
            raise ConfigError(f"update_weights(adapter={adapter!r}): no such adapter is loaded (loaded: "
                              f"{', '.join(self.adapters) or 'none'}); load it when the engine is built (loras=...).")
        transformer = getattr(self.pipe, denoiser, None)
        if transformer is None or transformer not in self._parallel.denoisers:
            raise ConfigError(f"update_weights(denoiser={denoiser!r}): this pipeline has no such denoiser.")
        if adapter is not None and adapter not in self._held:
            return 0  # PipeFusion: none of this adapter's tensors are on this stage
        tensor_parallel = self._parallel.tensor_parallel[self._parallel.denoisers.index(transformer)]
        with torch.no_grad():
            return update_transformer(transformer, named_tensors(weights), tensor_parallel,
                                      self.info.family.plan().stages, adapter)

    def _load_adapters(self, fp8) -> None:
        from .lora_files import check_pipeline_takes_lora
        from .loading.lora import (FIRST_EXPERT, check_linears_not_quantized, load_adapter,
                                   remove_adapters)

        check_lora_layout(True, self.mesh.config)
        check_pipeline_takes_lora(self.pipe)
        check_linears_not_quantized(self.pipe)  # FP8 GEMMs: parallelize quantizes after the adapters load
        keep = None
        if self.mesh.config.pipefusion_parallel_degree > 1:  # this stage's blocks only
            from .loading.stages import stage_keep

            keep = stage_keep(self.pipe.transformer, self.info.family.plan().stages, self.mesh.local_rank(MeshAxis.PP),
                              self.mesh.size(MeshAxis.PP))
        try:
            for name, path in self.adapters.items():
                count = load_adapter(self.pipe, name, path, keep, self.adapter_experts.get(name, (FIRST_EXPERT,)))
                self.adapter_tensors[name] = count
                if count:
                    self._held.add(name)
        except ConfigError:
            remove_adapters(self.pipe, sorted(self._held))  # nothing half-applied: the pipeline as it was loaded
            raise
        self._active = None  # diffusers leaves the last loaded adapter on: turn it off
        self._use_adapters(())

    def active_adapters(self, request: GenerateRequest) -> tuple:
        """The ((adapter name, weight), ...) `request` runs with."""
        return self._adapters_of(request)

    def _adapters_of(self, request: GenerateRequest) -> tuple:
        """The request's ((adapter name, weight), ...), each named by name or by the file it was loaded from."""
        import os

        names = []
        for name_or_path, weight in request.loras:
            given = os.path.abspath(name_or_path)  # a file, or the folder diffusers' save_lora_weights wrote
            name = name_or_path if name_or_path in self.adapters else next(
                (n for n, p in self.adapters.items() if given in (os.path.abspath(p), os.path.dirname(
                    os.path.abspath(p)))), None)
            if name is None:
                loaded = ", ".join(self.adapters) or "none"
                raise ConfigError(f"LoRA adapter {name_or_path!r} is not loaded (loaded: {loaded}); load it when "
                                  "the engine is built (--lora, --lora-dir, Engine.from_pretrained(loras=...))")
            names.append((name, float(weight)))
        return tuple(names)

    def _use_adapters(self, loras: tuple) -> None:
        """Switches the pipeline to `loras` (set_adapters: no reload) unless they are already set."""
        if loras != self._active and self.adapters:
            from .loading.lora import activate

            activate(self.pipe, loras, self._held)
        self._active = loras

    def _warn_unknown_words(self, prompts: list[str]) -> None:
        """UnknownWordsWarning once per word (on the output rank), for models that ship vocabulary.json."""
        if self._vocabulary is None or not self.mesh.is_output_rank:
            return
        unknown = [w for w in self._vocabulary.unknown_words(prompts) if w not in self._warned_words]
        plain = self._vocabulary.needs_plain_text(prompts) and "" not in self._warned_words
        lost = [p for p in self._vocabulary.prompts_without_known_words(prompts) if "\0" + p not in self._warned_words]
        if unknown or plain or lost:
            self._warned_words.update(unknown + ([""] if plain else []) + ["\0" + p for p in lost])
            warnings.warn(self._vocabulary.message(unknown, plain, lost), UnknownWordsWarning, stacklevel=3)

    def close(self) -> None:
        """Removes the parallel hooks. Under PipeFusion the other stages' blocks are gone for good."""
        if self._parallel is not None:
            self._parallel.remove()
            self._parallel = None


def _as_request(request) -> GenerateRequest | ResolvedRequest:
    """A GenerateRequest (or one resolved already), or a prompt (str) with every other value the model's default."""
    if isinstance(request, str):
        return GenerateRequest(prompt=request)
    if not isinstance(request, (GenerateRequest, ResolvedRequest)):
        raise ConfigError(f"Engine.generate takes a GenerateRequest or a prompt (str), got {type(request).__name__}: "
                          "e.g. engine.generate(GenerateRequest(prompt='a red circle', num_inference_steps=20)).")
    return request


@contextmanager
def _progress_bars(show: bool):
    """diffusers' and transformers' loading progress bars off unless asked for; their state restored after."""
    from diffusers.utils import logging as diffusers_logging
    from transformers.utils import logging as transformers_logging

    was = [not m.is_progress_bar_enabled() for m in (diffusers_logging, transformers_logging)]
    if not show:
        diffusers_logging.disable_progress_bar()
        transformers_logging.disable_progress_bar()
    try:
        yield
    finally:
        for module, disabled in zip((diffusers_logging, transformers_logging), was):
            module.disable_progress_bar() if disabled else module.enable_progress_bar()
