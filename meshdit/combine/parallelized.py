"""Parallelized: what parallelize() installed on a pipeline, and the one object the engine drives.

The engine calls, in order: share() (data parallelism keeps this rank's images),
denoise() (the serial / CFG-parallel loop or the PipeFusion loop, on the hooked
transformer), decode() (the VAE over the image group, or on its first rank, which
sends the images to the others), gather() (data parallelism
hands every rank all images). With a one-rank mesh each of them is the plain
single-process step.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import torch

from ..cache.run import cached_denoising
from ..distributed.comm import all_gather_uneven, all_reduce, broadcast_from, broadcast_object, split_sizes
from ..denoising.loop import denoise
from ..denoising.pipefusion_loop import pipefusion_denoise
from ..mesh_axes import MeshAxis
from ..vae import decode, decodes_here, share_images
from ..parallel import data


@dataclass
class Parallelized:
    mesh: object  # ParallelMesh, or SingleProcessMesh for one process
    handles: list = field(default_factory=list)
    pipefusion: object = None  # parallel.pipefusion.PipeFusion when pp > 1
    sequence_state: object = None  # the sequence hooks' state (PipeFusion sets its patch window)
    stage_plan: object = None  # the plan's StagePlan: the block lists a request's step cache hooks
    denoisers: list = field(default_factory=list)  # the transformers the plan applies to (parallelize.denoisers)
    cache_report: object = None  # meshdit.cache.run.CacheReport of the last denoise() whose request cached
    tensor_parallel: list = field(default_factory=list)  # per denoiser: parallel.tensor.TensorParallel, or None
    offload: str | None = None  # "blocks": the blocks' weights wait in host memory (parallel/offload.py)

    def share(self, recipe, state):
        return data.share(recipe, state, self.mesh)

    def denoise(self, recipe, state, request, show_progress: bool = False, on_step=None,
                total_images: int | None = None) -> torch.Tensor:
        """The final latents of this rank's share. NOTE: every rank of the mesh calls it with its share.
        `request` gives PipeFusion's run-time settings (warmup steps, patches, drift correction) and the step
        cache's (`request.cache`; its report lands in `cache_report`); total_images: the batch's images over
        the data-parallel ranks (default: this rank's)."""
        total_images = state.batch_size if total_images is None else total_images
        cfg_group = self.mesh.group(MeshAxis.CFG)
        self.cache_report = None
        # -- step cache (meshdit/cache): hooks for this generation only, when the request asks for one --
        with cached_denoising(self, state, request.cache, cfg_group) as cache:
            if cache is not None:
                on_step = cache.wrap(on_step)
            if self.pipefusion is None:
                latents = denoise(recipe, state, cfg_group, show_progress, on_step)
            else:
                latents = pipefusion_denoise(recipe, state, self.pipefusion, self.sequence_state, cfg_group,
                                             request.warmup_steps, request.patches(self.mesh.config), show_progress,
                                             on_step, kv_drift_correction=request.kv_drift_correction)
            if cache is not None:
                self.cache_report = cache.finish(state.batch_size, total_images)
        return latents

    def decode(self, vae, vae_input, settings, device, **vae_kwargs) -> torch.Tensor:
        """The decoded images [B, 3, H, W] (videos [B, 3, F, H, W]) on every rank of the image group (ranks that
        share the same images).

        vae_input() -> the latents as vae.decode takes them; called only on ranks that run the
        VAE (all of the group with parallel decode, else its rank 0, which sends the images on);
        vae_kwargs: passed on to vae.decode (LTX's timestep `temb`).
        """
        group = self.mesh.group(MeshAxis.IMAGE)
        image = decode(vae, vae_input(), settings, group, **vae_kwargs) if decodes_here(settings, group) else None
        return share_images(image, settings, group, device)

    def gather(self, image: torch.Tensor, batch_size: int) -> torch.Tensor:
        return data.gather(image, batch_size, self.mesh)

    def collect(self, record: dict | None, batch_size: int) -> dict:
        """Per-image tensors this rank's steps recorded ({name: [B_dp, ...]}; None on PipeFusion stages that take no
        step) -> the whole batch's [batch_size, ...] on every rank: from the last stage, then over dp.
        NOTE: every rank of the mesh joins."""
        if self.pipefusion is not None and self.pipefusion.num_stages > 1:
            group, last = self.mesh.group(MeshAxis.PP), self.pipefusion.num_stages - 1
            keys = broadcast_object(sorted(record) if record else None, last, group, "trajectory_keys")
            record = {k: broadcast_from(record[k].contiguous() if record else None, last, group,
                                        "trajectory_broadcast", self.mesh.device) for k in keys}
        sizes = split_sizes(batch_size, self.mesh.size(MeshAxis.DP))
        return {k: all_gather_uneven(v.contiguous(), 0, sizes, self.mesh.group(MeshAxis.DP), "trajectory_all_gather")
                for k, v in record.items()}

    def agreed(self, on_step, device):
        """on_step, made collective: an all-reduce (MAX) of its stop flag, so every rank stops at the same step."""
        if on_step is None:
            return None

        def stop(step: int, total: int) -> bool:
            flag = torch.tensor([1 if on_step(step, total) else 0], device=device)
            return bool(all_reduce(flag, self.mesh.world_group, "step_flag_all_reduce", op="max").item())

        return stop

    def remove(self) -> None:
        for handle in self.handles:
            handle.remove()
        self.handles = []
