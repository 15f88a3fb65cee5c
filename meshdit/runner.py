"""What each rank of `meshdit generate` runs: the shared rank bootstrap (rank.start_rank), generate, save."""
from __future__ import annotations

import warnings
from dataclasses import dataclass

from .config import GenerateRequest
from .engine_settings import EngineSettings
from .output import save_images, save_videos
from .prompt_vocabulary import UnknownWordsWarning
from .rank import start_rank

# NOTE: no torch, diffusers or transformers at module level: a spawned rank imports this module to
# unpickle its job, and quiet_libraries() (in start_rank) must run before those imports to keep their
# import-time warnings out of non-verbose runs.


@dataclass
class GenerateJob:
    engine: EngineSettings
    request: GenerateRequest
    output: str
    predicted_s: float | None = None
    """--layout auto: the planner's end-to-end prediction, printed beside the measured time."""


def run_generate(job: GenerateJob) -> None:
    """One rank's work; the launcher tears the process group down afterwards."""
    ranked = start_rank(job.engine)
    import torch.distributed as dist

    from .vae import peak_memory_report

    engine, mesh, settings = ranked.engine, ranked.mesh, job.engine
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
        fp8 = f" with {settings.fp8.describe()}" if settings.fp8 else ""
        # which adapters ran, and how many of their tensors this rank loaded (PipeFusion: its stage's)
        fp8 += "".join(f", LoRA {name} ({engine.adapter_tensors.get(name, 0)} tensors) at weight {weight:g}"
                       for name, weight in engine.active_adapters(job.request))
        print(f"meshdit: {len(paths)} {what} height {height} x width {width}, {job.request.num_inference_steps} "
              f"steps, layout {settings.config.describe()}{fp8} on {dist.get_world_size()} rank(s) "
              f"({mesh.device.type}): {s['total']:.2f} s (prepare {s['prepare']:.2f}, denoise {s['denoise']:.2f}, "
              f"decode {s['decode']:.2f}; model load {ranked.load_seconds:.2f} s)"
              + (f"; the planner predicted {job.predicted_s:.2f} s" if job.predicted_s is not None else ""))
        if result.cache is not None:  # per guidance branch and image, averaged (docs/caching.md)
            print(f"meshdit: step cache ({job.request.cache.method}): {result.cache.computed_steps()} of "
                  f"{result.cache.steps} steps computed, {result.cache.cached_steps()} cached")
        for path in paths:
            print(f"meshdit: wrote {path}")
    if settings.verbose:
        report = peak_memory_report()
        if report:
            print(f"meshdit: rank {dist.get_rank()} VAE decode ({report.get('mode')}, latent "
                  f"{report.get('latent_shape')}): peak activations {report.get('peak_mib', 0):.2f} MiB, "
                  f"peak RSS growth {report.get('peak_rss_delta_bytes', 0) / 2**20:.2f} MiB")
