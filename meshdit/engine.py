"""Engine: one pipeline, parallelized over a mesh, generating images from requests."""
from __future__ import annotations

import time
from contextlib import contextmanager
from dataclasses import dataclass, field

import numpy as np
import torch
import torch.distributed as dist

from .config import GenerateRequest, ParallelConfig
from .distributed.comm import split_sizes
from .distributed.mesh import ParallelMesh
from .models.info import ModelInfo
from .parallel.parallelize import parallelize
from .pipelines.batching import concat_states
from .pipelines.loop import denoise
from .pipelines.pipefusion_loop import pipefusion_denoise
from .vae import VaeDecodeSettings
from .vae import decode as vae_decode
from .vae import decodes_here, share_images


@dataclass
class GenerateResult:
    images: object  # what the pipeline's image processor returns for output_type: np.ndarray [N, H, W, 3] or PIL
    seconds: dict[str, float] = field(default_factory=dict)  # prepare / denoise / decode


class Engine:
    """Runs a diffusers pipeline through meshdit's loop, over `mesh` when given.

    NOTE: with a mesh, every rank of the mesh must call generate() with the same
    request: the ranks cooperate on each transformer call.
    """

    def __init__(self, pipe, mesh: ParallelMesh | None = None, vae: VaeDecodeSettings | None = None, fp8=None) -> None:
        self.pipe = pipe
        self.mesh = mesh
        self.vae = vae or VaeDecodeSettings()
        self.vae.validate()
        self.info = ModelInfo.from_pipeline(pipe)
        self.recipe = self.info.family.recipe_class()(pipe)
        if mesh is not None:
            self.info.check_layout(mesh.config)  # the CLI's ConfigError, before any hook is installed
        self._parallel = parallelize(pipe, self.info.family, mesh, fp8) if mesh is not None or fp8 else None

    @classmethod
    def from_pretrained(cls, model: str | None = None, mesh: ParallelMesh | None = None, torch_dtype=None,
                        vae: VaeDecodeSettings | None = None, show_progress: bool = False,
                        loading=None, fp8=None) -> "Engine":
        """`model`: a pipeline folder or Hub id; None: meshdit's bundled model (with its own size, steps and
        guidance as request defaults). Loading progress bars show only with show_progress=True.
        `loading`: LoadOptions (memory-efficient load, text-encoder placement); `fp8`: Fp8Config."""
        from .pipelines.loading import load_pipeline

        if model is None:
            from .default_model import weights_path

            model = str(weights_path())
        device = mesh.device if mesh is not None else torch.device("cpu")
        vae_here = decodes_here(vae or VaeDecodeSettings(), mesh.group("image") if mesh is not None else None)
        with _progress_bars(show_progress):
            pipe = load_pipeline(model, device, torch_dtype, mesh, loading, vae_here=vae_here,
                                 fp8_gemm=fp8 is not None and fp8.gemm)
        return cls(pipe, mesh, vae, fp8)

    def resolve(self, request: GenerateRequest) -> GenerateRequest:
        """The request with unset values from this model's defaults (the same ones `meshdit generate` uses)."""
        return request.with_defaults(self.info.request_defaults())

    def check(self, request: GenerateRequest) -> None:
        """Raises ConfigError if this request cannot run on this layout (or at all)."""
        config = self.mesh.config if self.mesh is not None else ParallelConfig()
        self.info.check_request(config, request)

    @torch.inference_mode()
    def generate(self, request: GenerateRequest, output_type: str = "np", show_progress: bool = False,
                 on_step=None) -> GenerateResult:
        """on_step(step, total) -> bool is called on every rank before each step; if it returns True on
        any rank, every rank stops at that step (GenerationCancelled), agreed through the mesh."""
        return self.generate_many([request], output_type, show_progress, on_step)[0]

    @torch.inference_mode()
    def generate_many(self, requests: list[GenerateRequest], output_type: str = "np", show_progress: bool = False,
                      on_step=None) -> list[GenerateResult]:
        """Requests with the same size, steps and guidance run as one batch (split over dp); each request's
        images are its own seed's, as if it ran alone. One result per request."""
        requests = [self.resolve(r) for r in requests]
        # The data-parallel split needs enough images in the whole batch, not in each request.
        total = sum(len(r.prompts) * r.num_images_per_prompt for r in requests)
        config = self.mesh.config if self.mesh is not None else ParallelConfig()
        for request in requests:
            self.info.check_request(config, request, num_images=total)
        seconds = {}
        start = time.perf_counter()
        # Noise is drawn on the CPU from the seed, so every rank and every layout starts from the same latents.
        states = [self.recipe.prepare(r, torch.Generator("cpu").manual_seed(r.seed), self.pipe._execution_device)
                  for r in requests]
        counts = [s.batch_size for s in states]
        state = self._data_parallel_share(concat_states(self.recipe, states))
        seconds["prepare"] = time.perf_counter() - start
        cfg_group = self.mesh.group("cfg") if self.mesh is not None else None
        agreed = self._agreed(on_step)
        if self._parallel is not None and self._parallel.pipefusion is not None:
            config = self.mesh.config
            latents = pipefusion_denoise(self.recipe, state, self._parallel.pipefusion, self._parallel.sequence_state,
                                         cfg_group, config.warmup_steps, config.patches, show_progress, agreed)
        else:
            latents = denoise(self.recipe, state, cfg_group, show_progress, agreed)
        seconds["denoise"] = time.perf_counter() - start - seconds["prepare"]
        image_group = self.mesh.group("image") if self.mesh is not None else None
        images = None
        if decodes_here(self.vae, image_group):  # else this rank has no VAE weights: it gets the images
            vae_input = self.recipe.decode_latents(state, latents)
            image = vae_decode(self.pipe.vae, vae_input, self.vae, image_group)  # [B, 3, H, W] in [-1, 1]
            images = self.pipe.image_processor.postprocess(image, output_type=output_type)
        images = share_images(images, self.vae, image_group)
        images = self._gather_data_parallel(images)
        seconds["decode"] = time.perf_counter() - start - seconds["prepare"] - seconds["denoise"]
        seconds["total"] = time.perf_counter() - start
        offsets = np.cumsum([0] + counts)
        return [GenerateResult(images[a:b], dict(seconds)) for a, b in zip(offsets[:-1], offsets[1:])]

    def _agreed(self, on_step):
        """on_step, made collective: an all-reduce(MAX) of the stop flag, so all ranks stop at the same step."""
        if on_step is None:
            return None

        def stop(step: int, total: int) -> bool:
            flag = torch.tensor([1 if on_step(step, total) else 0], device=self.pipe._execution_device)
            if self.mesh is not None and dist.get_world_size() > 1:
                dist.all_reduce(flag, op=dist.ReduceOp.MAX)
            return bool(flag.item())

        return stop

    def _data_parallel_share(self, state):
        """Every rank drew the whole batch's noise from the seed; a data-parallel group keeps its images.

        So image i starts from the same noise whatever the layout, and the images
        match a one-process run of the same request.
        """
        if self.mesh is None or self.mesh.size("dp") == 1:
            return state
        sizes = split_sizes(state.batch_size, self.mesh.size("dp"))
        start = sum(sizes[: self.mesh.local_rank("dp")])
        return self.recipe.slice_batch(state, start, start + sizes[self.mesh.local_rank("dp")])

    def _gather_data_parallel(self, images):
        """Every rank returns all images, in request order.

        NOTE: all ranks of the dp axis join this gather.
        """
        if self.mesh is None or self.mesh.size("dp") == 1:
            return images
        parts = [None] * self.mesh.size("dp")
        dist.all_gather_object(parts, images, group=self.mesh.group("dp"))
        if isinstance(images, np.ndarray):
            return np.concatenate(parts)
        return [image for part in parts for image in part]

    def close(self) -> None:
        """Removes the parallel hooks. Under PipeFusion the other stages' blocks are gone for good."""
        if self._parallel is not None:
            self._parallel.remove()
            self._parallel = None


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
