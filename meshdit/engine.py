"""Engine: one pipeline, parallelized over a mesh, generating images from requests."""
from __future__ import annotations

import time
from dataclasses import dataclass, field

import numpy as np
import torch
import torch.distributed as dist

from .config import GenerateRequest, ParallelConfig
from .distributed.comm import split_sizes
from .distributed.mesh import ParallelMesh
from .models.info import ModelInfo
from .parallel.parallelize import parallelize
from .pipelines.loop import denoise
from .pipelines.pipefusion_loop import pipefusion_denoise
from .vae import VaeDecodeSettings
from .vae import decode as vae_decode


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
        self._parallel = parallelize(pipe, self.info.family, mesh, fp8) if mesh is not None or fp8 else None

    @classmethod
    def from_pretrained(cls, model: str, mesh: ParallelMesh | None = None, torch_dtype=None,
                        vae: VaeDecodeSettings | None = None, fp8=None) -> "Engine":
        from .pipelines.loading import load_pipeline

        device = mesh.device if mesh is not None else torch.device("cpu")
        return cls(load_pipeline(model, device, torch_dtype), mesh, vae, fp8)

    def check(self, request: GenerateRequest) -> None:
        """Raises ConfigError if this request cannot run on this layout (or at all)."""
        config = self.mesh.config if self.mesh is not None else ParallelConfig()
        num_images = len(request.prompts) * request.num_images_per_prompt
        self.info.check(config, *self.recipe.size(request), request.guidance_scale, num_images)

    @torch.inference_mode()
    def generate(self, request: GenerateRequest, output_type: str = "np", show_progress: bool = False) -> GenerateResult:
        self.check(request)
        seconds = {}
        start = time.perf_counter()
        # Noise is drawn on the CPU from the seed, so every rank and every layout starts from the same latents.
        generator = torch.Generator("cpu").manual_seed(request.seed)
        state = self.recipe.prepare(request, generator, self.pipe._execution_device)
        state = self._data_parallel_share(state)
        seconds["prepare"] = time.perf_counter() - start
        cfg_group = self.mesh.group("cfg") if self.mesh is not None else None
        if self._parallel is not None and self._parallel.pipefusion is not None:
            config = self.mesh.config
            latents = pipefusion_denoise(self.recipe, state, self._parallel.pipefusion, self._parallel.sequence_state,
                                         cfg_group, config.warmup_steps, config.patches, show_progress)
        else:
            latents = denoise(self.recipe, state, cfg_group, show_progress)
        seconds["denoise"] = time.perf_counter() - start - seconds["prepare"]
        vae_input = self.recipe.decode_latents(state, latents)
        image_group = self.mesh.group("image") if self.mesh is not None else None
        image = vae_decode(self.pipe.vae, vae_input, self.vae, image_group)  # [B, 3, H, W] in [-1, 1]
        images = self.pipe.image_processor.postprocess(image, output_type=output_type)
        images = self._gather_data_parallel(images)
        seconds["decode"] = time.perf_counter() - start - seconds["prepare"] - seconds["denoise"]
        seconds["total"] = time.perf_counter() - start
        return GenerateResult(images, seconds)

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
