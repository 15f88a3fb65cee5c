"""What each rank of `meshdit generate` runs: join the world, build the mesh, load, generate, save."""
from __future__ import annotations

import os
import time
import warnings
from dataclasses import dataclass

from .config import GenerateRequest, ParallelConfig
from .logs import quiet_libraries
from .output import save_images, save_videos
from .prompt_vocabulary import UnknownWordsWarning
from .vae import VaeDecodeSettings

# NOTE: no torch, diffusers or transformers at module level: a spawned rank imports this module to
# unpickle its job, and quiet_libraries() must run before those imports to keep their import-time
# warnings out of non-verbose runs.
DTYPES = ("float32", "bfloat16", "float16")


@dataclass
class GenerateJob:
    model: str
    config: ParallelConfig
    request: GenerateRequest
    output: str
    dtype: str | None = None  # None: bf16 on GPU, fp32 on CPU
    verbose: bool = False
    vae: VaeDecodeSettings | None = None
    loading: object = None  # meshdit.loading.LoadOptions; None: the defaults
    fp8: object = None  # meshdit.quant.settings.Fp8Config, None: no FP8


def run_generate(job: GenerateJob) -> None:
    """One rank's work; the launcher tears the process group down afterwards."""
    quiet_libraries(job.verbose)
    import torch
    import torch.distributed as dist

    from .distributed.mesh import ParallelMesh, init_distributed
    from .engine import Engine
    from .vae import peak_memory_report

    device = init_distributed()
    if device.type == "cpu":
        # One thread per rank unless OMP_NUM_THREADS says otherwise: small models run fastest so, and
        # several threads per rank on a busy machine oversubscribe its cores (measured 1.4 s vs 45 s
        # for the default model with 2 threads while another process held one of 2 cores).
        torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS") or 1))
    mesh = ParallelMesh.build(job.config, device)
    start = time.perf_counter()
    engine = Engine.from_pretrained(job.model, mesh, getattr(torch, job.dtype) if job.dtype in DTYPES else None,
                                    job.vae, job.verbose, loading=job.loading, fp8=job.fp8)
    load_s = time.perf_counter() - start
    with warnings.catch_warnings():  # the CLI warned about unknown words before the ranks started
        warnings.simplefilter("ignore", UnknownWordsWarning)
        result = engine.generate(job.request, output_type="np", show_progress=mesh.is_output_rank)
    if mesh.is_output_rank:
        s = result.seconds
        if engine.info.is_video:  # [N, F, H, W, 3]
            request = engine.resolve(job.request)
            paths = save_videos(result.images, job.output, request.fps)
            frames, height, width = result.images.shape[1:4]
            what = f"video(s) of {frames} frames at {request.fps} fps,"
        else:
            paths = save_images(result.images, job.output)
            height, width = result.images.shape[1:3]
            what = "image(s)"
        print(f"meshdit: {len(paths)} {what} height {height} x width {width}, {job.request.num_inference_steps} "
              f"steps, layout {job.config.describe()}{f' with {job.fp8.describe()}' if job.fp8 else ''} on "
              f"{dist.get_world_size()} rank(s) ({device.type}): "
              f"{s['total']:.2f} s (prepare {s['prepare']:.2f}, denoise {s['denoise']:.2f}, "
              f"decode {s['decode']:.2f}; model load {load_s:.2f} s)")
        if result.cache is not None:  # per guidance branch and image, averaged (docs/caching.md)
            print(f"meshdit: step cache ({job.request.cache.method}): {result.cache.computed_steps()} of "
                  f"{result.cache.steps} steps computed, {result.cache.cached_steps()} cached")
        for path in paths:
            print(f"meshdit: wrote {path}")
    if job.verbose:
        report = peak_memory_report()
        if report:
            print(f"meshdit: rank {dist.get_rank()} VAE decode ({report.get('mode')}, latent "
                  f"{report.get('latent_shape')}): peak activations {report.get('peak_mib', 0):.2f} MiB, "
                  f"peak RSS growth {report.get('peak_rss_delta_bytes', 0) / 2**20:.2f} MiB")
