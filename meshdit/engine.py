"""Engine: one pipeline, parallelized over a mesh, generating images from requests."""
from __future__ import annotations

import time
from dataclasses import dataclass, field

import torch

from .config import GenerateRequest
from .distributed.mesh import ParallelMesh
from .models.info import ModelInfo
from .parallel.parallelize import parallelize
from .pipelines.loop import denoise


@dataclass
class GenerateResult:
    images: object  # what the pipeline's image processor returns for output_type: np.ndarray [N, H, W, 3] or PIL
    seconds: dict[str, float] = field(default_factory=dict)  # prepare / denoise / decode


class Engine:
    """Runs a diffusers pipeline through meshdit's loop, over `mesh` when given.

    NOTE: with a mesh, every rank of the mesh must call generate() with the same
    request: the ranks cooperate on each transformer call.
    """

    def __init__(self, pipe, mesh: ParallelMesh | None = None) -> None:
        self.pipe = pipe
        self.mesh = mesh
        self.info = ModelInfo.from_pipeline(pipe)
        self.recipe = self.info.family.recipe_class()(pipe)
        self._handles = parallelize(pipe, self.info.family, mesh) if mesh is not None else []

    @classmethod
    def from_pretrained(cls, model: str, mesh: ParallelMesh | None = None, torch_dtype=None) -> "Engine":
        from .pipelines.loading import load_pipeline

        device = mesh.device if mesh is not None else torch.device("cpu")
        return cls(load_pipeline(model, device, torch_dtype), mesh)

    def check(self, request: GenerateRequest) -> None:
        """Raises ConfigError if this request cannot run on this layout."""
        if self.mesh is not None:
            self.info.check(self.mesh.config, *self.recipe.size(request))

    @torch.inference_mode()
    def generate(self, request: GenerateRequest, output_type: str = "np", show_progress: bool = False) -> GenerateResult:
        self.check(request)
        seconds = {}
        start = time.perf_counter()
        # Noise is drawn on the CPU from the seed, so every rank and every layout starts from the same latents.
        generator = torch.Generator("cpu").manual_seed(request.seed)
        state = self.recipe.prepare(request, generator, self.pipe._execution_device)
        seconds["prepare"] = time.perf_counter() - start
        latents = denoise(self.recipe, state, show_progress)
        seconds["denoise"] = time.perf_counter() - start - seconds["prepare"]
        vae_input = self.recipe.decode_latents(state, latents)
        image = self.pipe.vae.decode(vae_input, return_dict=False)[0]  # [B, 3, H, W] in [-1, 1]
        images = self.pipe.image_processor.postprocess(image, output_type=output_type)
        seconds["decode"] = time.perf_counter() - start - seconds["prepare"] - seconds["denoise"]
        seconds["total"] = time.perf_counter() - start
        return GenerateResult(images, seconds)

    def close(self) -> None:
        """Removes the parallel hooks: the pipeline runs serially again."""
        for handle in self._handles:
            handle.remove()
        self._handles = []
