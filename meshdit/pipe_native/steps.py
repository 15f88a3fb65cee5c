"""The step cache of one `pipe(...)` call: meshdit/cache's StepCache on every denoiser, told where each step begins.

The Engine's loop tells the caches each step; diffusers' own loop does not, so a pre-hook on each denoiser reads its
`timestep` argument (its largest value): one that differs from the last call's begins a step (a pipeline that calls the transformer once
per guidance branch calls it with the same timestep, each call keeping its own slot, as in the Engine). Decisions are
per image row, from global sums over the sequence group, so every rank takes the same one; installed for the call
and removed after it.
"""
from __future__ import annotations

import inspect

import torch

from ..cache.step_cache import StepCache
from ..mesh_axes import MeshAxis


class StepCaches:
    def __init__(self, state) -> None:
        self.state = state
        self.caches: list[StepCache] = []
        self.handles: list = []
        self.report = None

    def __enter__(self) -> "StepCaches":
        state = self.state
        if state.cache is None:
            return self
        mesh = state.mesh
        stages = mesh.group(MeshAxis.PP) if mesh.size(MeshAxis.PP) > 1 else None
        seen: list = []  # the timesteps of this call, in order (shared by the experts: Wan 2.2)
        for transformer in state.parallel.denoisers:
            cache = StepCache(transformer, state.plan.stages, state.cache, mesh.group(MeshAxis.SP), stages)
            self.caches.append(cache)
            signature = inspect.signature(transformer.forward)

            def begin(_module, args, kwargs, cache=cache, signature=signature):
                arguments = signature.bind_partial(*args, **kwargs).arguments
                t = arguments.get("timestep", arguments.get("t"))  # Z-Image names it t
                # the largest value: per-token timesteps (LTX's conditions, Wan 2.2 TI2V) hold 0 on conditioned tokens
                key = float(t.max()) if isinstance(t, torch.Tensor) else t
                if not seen or seen[-1] != key:
                    seen.append(key)
                if cache.step != len(seen) - 1 or not cache.slots:  # a new step for this denoiser
                    cache.begin_step(len(seen) - 1)

            # prepend: before the cache's own call counter, which begin_step resets
            self.handles.append(transformer.register_forward_pre_hook(begin, with_kwargs=True, prepend=True))
        return self

    def __exit__(self, *exc) -> None:
        if self.caches:
            self.report = {i: cache.masks() for i, cache in enumerate(self.caches)}
        for handle in self.handles:
            handle.remove()
        for cache in self.caches:
            cache.remove()
        self.handles, self.caches = [], []
