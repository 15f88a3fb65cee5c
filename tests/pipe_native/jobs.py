"""Pool jobs of the pipe-native tests (module level: pickled to the ranks).

run_case builds one pipeline class's tiny pipeline, calls it plainly (every rank computes the same one-process
reference: the same weights, arguments and seed), then, for each layout, parallelizes it over the pool's mesh,
calls it again, unparallelizes it and returns the largest difference relative to the reference's largest value.
"""
from __future__ import annotations

import numpy as np
import torch

import meshdit
from meshdit.cache.settings import CacheSettings
from meshdit.config import ParallelConfig
from meshdit.testing.rank_pool import mesh_for
from meshdit.vae.settings import VaeDecodeSettings
from tests.pipe_native.cases import CASES

CACHE = CacheSettings("fbcache", warmup=1, threshold=10.0)  # caches every step after the first: the mask matters

LAYOUTS = {
    # name -> (degrees, parallelize options)
    "ulysses": (dict(ulysses_degree=2), {}),
    "ring": (dict(ring_degree=2), {}),
    "usp": (dict(ulysses_degree=2, ring_degree=2), {}),
    "tp": (dict(tensor_parallel_degree=2), {}),
    "cfg": (dict(cfg_degree=2), {}),
    "vae": (dict(ulysses_degree=2), dict(vae=VaeDecodeSettings(parallel=True))),
    "cache": (dict(ulysses_degree=2), dict(cache=CACHE)),
    "cfg-ulysses": (dict(cfg_degree=2, ulysses_degree=2), {}),
}


def as_array(result, output_type: str) -> np.ndarray:
    images = result.frames if hasattr(result, "frames") else result.images
    if output_type == "pil":
        return np.stack([np.asarray(image, dtype=np.float32) for image in images])
    if isinstance(images, torch.Tensor):
        return images.float().numpy()
    return np.asarray(images, dtype=np.float32)


def call(pipe, name: str, output_type: str = "np") -> np.ndarray:
    kwargs = CASES[name].call()
    kwargs.setdefault("num_inference_steps", CASES[name].steps)
    with torch.inference_mode():
        result = pipe(**kwargs, generator=torch.Generator().manual_seed(3), output_type=output_type)
    return as_array(result, output_type)


def build(name: str):
    pipe = CASES[name].build()
    pipe.set_progress_bar_config(disable=True)
    return pipe


def relative_difference(out: np.ndarray, ref: np.ndarray) -> float:
    if out.shape != ref.shape:
        return float("inf")
    return float(np.abs(out - ref).max() / max(float(np.abs(ref).max()), 1e-12))


def run_case(name: str, layouts: list[str], output_type: str = "np") -> dict[str, float]:
    """{layout: max |pipe-native - one process| / max |one process|} on this rank."""
    pipe = build(name)
    reference = call(pipe, name, output_type)
    differences = {}
    for layout in layouts:
        degrees, options = LAYOUTS[layout]
        expected = reference
        if "cache" in options:  # the cached serial run: the same decisions on one process
            with meshdit.parallelized(pipe, None, **options):
                expected = call(pipe, name, output_type)
        meshdit.parallelize(pipe, mesh_for(ParallelConfig(**degrees)), **options)
        try:
            differences[layout] = relative_difference(call(pipe, name, output_type), expected)
        finally:
            if layout == "tp":  # the weights are shards now: a fresh pipeline for what follows
                pipe = build(name)
            else:
                meshdit.unparallelize(pipe)
    return differences
