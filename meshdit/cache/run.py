"""One generation's step caches: installed on every denoiser before the loop, reported and removed after it."""
from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass, field

from ..distributed.comm import all_reduce, split_sizes
from ..cache_settings import CacheSettings
from ..mesh_axes import MeshAxis
from .step_cache import StepCache


@dataclass
class CacheReport:
    """Which steps each image's guidance branches skipped. masks[(branch, image)][step]: True = cached (the middle
    blocks' residual reused), False = computed; image counts over the whole batch (all data-parallel ranks)."""

    steps: int
    masks: dict = field(default_factory=dict)

    def computed_steps(self, images: range | None = None) -> int:
        """Steps that ran the middle blocks, averaged over the guidance branches and `images` (default: all),
        rounded: the work done, in steps (branches that skip different steps each save their own calls)."""
        keys = [k for k in self.masks if images is None or k[1] in images]
        if not keys:
            return self.steps
        return round(sum(self.steps - sum(self.masks[k]) for k in keys) / len(keys))

    def computed_calls(self) -> tuple[int, int]:
        """(image-branch-steps that ran the middle blocks, all image-branch-steps)."""
        return sum(self.steps - sum(m) for m in self.masks.values()), self.steps * len(self.masks)

    def cached_steps(self, images: range | None = None) -> int:
        return self.steps - self.computed_steps(images)

    def of_images(self, images: range) -> "CacheReport":
        """The report of `images` of the batch, numbered from 0 (one request's share of a batch)."""
        return CacheReport(self.steps, {(b, i - images.start): m for (b, i), m in self.masks.items() if i in images})


class CacheRun:
    """What Parallelized.denoise wraps the loop in when a request asks for a cache (`--cache`)."""

    def __init__(self, transformers, plan, settings: CacheSettings, mesh, branches: list[str], local: list[str],
                 steps: int) -> None:
        self.mesh, self.branches, self.local, self.steps = mesh, branches, local, steps
        stages = mesh.group(MeshAxis.PP) if mesh.size(MeshAxis.PP) > 1 else None
        self.caches = [StepCache(t, plan, settings, mesh.group(MeshAxis.SP), stages) for t in transformers]

    def wrap(self, on_step):
        """on_step, telling the caches each step first."""
        def step(i: int, total: int) -> bool:
            for cache in self.caches:
                cache.begin_step(i)
            return bool(on_step(i, total)) if on_step is not None else False
        return step

    def finish(self, batch_size: int, total_images: int) -> CacheReport:
        """The report of the whole batch on every rank: one all-reduce (max) over the world of a
        [branches, images, steps] code tensor (0: not this rank's, 1: computed, 2: cached).
        batch_size: this rank's images; total_images: the batch's, over the data-parallel ranks."""
        import torch

        codes = torch.zeros(len(self.branches), total_images, self.steps, dtype=torch.int32)
        offset = sum(split_sizes(total_images, self.mesh.size(MeshAxis.DP))[:self.mesh.local_rank(MeshAxis.DP)])
        for cache in self.caches:  # Wan 2.2: each expert fills the steps it ran
            for slot_index, rows in enumerate(cache.masks()):
                batched = len(self.local) > 1 and len(rows) == len(self.local) * batch_size
                for row, mask in enumerate(rows):
                    branch = self.local[row // batch_size if batched else slot_index]
                    steps = cache.steps_run[slot_index]
                    for step, cached in zip(steps, mask):
                        codes[self.branches.index(branch), offset + row % batch_size, step] = 2 if cached else 1
        codes = all_reduce(codes.to(self.mesh.device), self.mesh.world_group, "cache_report_all_reduce",
                           op="max").cpu()
        masks = {(branch, image): tuple(bool(c == 2) for c in codes[b, image].tolist())
                 for image in range(total_images) for b, branch in enumerate(self.branches)}
        return CacheReport(self.steps, masks)

    def remove(self) -> None:
        for cache in self.caches:
            cache.remove()


@contextmanager
def cached_denoising(parallel, state, settings: CacheSettings, cfg_group):
    """Yields a CacheRun (None when the request has no cache); its report is complete after the block."""
    if settings is None or not settings.enabled:
        yield None
        return
    from ..parallel.cfg import local_branches

    branches, local, _ = local_branches(state, cfg_group)
    run = CacheRun(parallel.denoisers, parallel.stage_plan, settings, parallel.mesh, branches, local,
                   len(state.timesteps))
    try:
        yield run
    finally:
        run.remove()
