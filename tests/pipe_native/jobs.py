"""Pool jobs of the pipe-native tests (module level: pickled to the ranks).

run_case builds one pipeline class's tiny pipeline, calls it plainly (every rank computes the same one-process
reference: the same weights, arguments and seed), then, for each layout, parallelizes it over the pool's mesh,
calls it again, unparallelizes it and returns the largest difference relative to the reference's largest value.
"""
from __future__ import annotations

import inspect

import numpy as np
import torch

import meshdit
import meshdit.pipe_native
from meshdit.cache_settings import CacheSettings
from meshdit.config import ParallelConfig
from meshdit.testing.rank_pool import mesh_for
from meshdit.vae.settings import VaeDecodeSettings
from tests.pipe_native.cases import CASES

CACHE = CacheSettings("fbcache", warmup=1, threshold=10.0)  # caches every step after the first: the mask matters

LAYOUTS = {
    # name -> (degrees, parallelize options)
    "ulysses": (dict(ulysses_degree=2), {}),
    "ring": (dict(ring_degree=2), {}),
    "tp": (dict(tensor_parallel_degree=2), {}),
    "cfg": (dict(cfg_degree=2), {}),
    "vae": (dict(ulysses_degree=2), dict(vae=VaeDecodeSettings(parallel=True))),
    "cache": (dict(ulysses_degree=2), dict(cache=CACHE)),
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
    taken = inspect.signature(type(pipe).__call__).parameters
    for size in ("height", "width"):  # HunyuanVideo 1.5's image-to-video takes its size from the image
        if size not in taken:
            kwargs.pop(size, None)
    torch.manual_seed(4)  # ControlNet pipelines encode the control image with torch's global RNG (no generator)
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
        if "cache" in options and CASES[name].cache:
            options = dict(options, cache=CacheSettings(**CASES[name].cache))
        if "cache" in options:  # the cached serial run: the same decisions on one process
            with meshdit.parallelized(pipe, None, **options):
                expected = call(pipe, name, output_type)
        meshdit.parallelize(pipe, mesh_for(ParallelConfig(**degrees)), **options)
        try:
            differences[layout] = relative_difference(call(pipe, name, output_type), expected)
            report = meshdit.pipe_native.installed(pipe).cache_report
            if "cache" in options and not any(c for masks in report.values() for slot in masks for row in slot
                                              for c in row):
                raise AssertionError(f"{name}: the step cache skipped no step: the cache layout tested nothing")
        finally:
            if layout == "tp":  # the weights are shards now: a fresh pipeline for what follows
                pipe = build(name)
            else:
                meshdit.unparallelize(pipe)
    return differences


def run_cases(names: list[str]) -> dict[str, dict[str, float]]:
    """run_case of several classes (their VERIFIED layouts) in one pool job: one job's overhead for a group."""
    from meshdit.pipe_native.support import VERIFIED

    return {name: run_case(name, list(VERIFIED[name])) for name in names}


def lora_after_parallelize(folder: str) -> tuple[float, float]:
    """FLUX.1 with a LoRA loaded through diffusers' own load_lora_weights after meshdit.parallelize (Ulysses 2):
    (its difference from the same load in one process, the adapter's effect), relative to the largest value."""
    from meshdit.testing.tiny_lora import save_tiny_lora

    path = save_tiny_lora("flux", f"{folder}/lora.safetensors") if _rank() == 0 else None
    import torch.distributed as dist

    dist.barrier()
    path = f"{folder}/lora.safetensors"
    pipe = build("FluxPipeline")
    plain = call(pipe, "FluxPipeline")
    pipe.load_lora_weights(path, adapter_name="style")
    reference = call(pipe, "FluxPipeline")
    pipe.unload_lora_weights()
    meshdit.parallelize(pipe, mesh_for(ParallelConfig(ulysses_degree=2)))
    pipe.load_lora_weights(path, adapter_name="style")
    pipe.set_adapters(["style"], [1.0])
    adapted = call(pipe, "FluxPipeline")
    meshdit.unparallelize(pipe)
    return relative_difference(adapted, reference), relative_difference(plain, reference)


def _rank() -> int:
    import torch.distributed as dist

    return dist.get_rank()


def unparallelize_restores(name: str) -> bool:
    """After parallelize (Ulysses 2, cfg-free; parallel VAE; cache) and unparallelize, the pipeline's class, its
    VAE's decode, its transformer's hooks and torch's SDPA are what they were."""
    import torch.nn.functional as F

    pipe = build(name)
    before = (type(pipe), dict(pipe.vae.__dict__).get("decode"), _hook_counts(pipe.transformer),
              F.scaled_dot_product_attention)
    meshdit.parallelize(pipe, mesh_for(ParallelConfig(ulysses_degree=2)), vae=True, cache=CACHE)
    during = (type(pipe), dict(pipe.vae.__dict__).get("decode"), _hook_counts(pipe.transformer),
              F.scaled_dot_product_attention)
    call(pipe, name)
    meshdit.unparallelize(pipe)
    after = (type(pipe), dict(pipe.vae.__dict__).get("decode"), _hook_counts(pipe.transformer),
             F.scaled_dot_product_attention)
    changed = all(a != b for a, b in zip(before, during))
    return changed and before == after


def _hook_counts(module) -> int:
    return sum(len(m._forward_hooks) + len(m._forward_pre_hooks) for m in module.modules())

