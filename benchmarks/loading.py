"""Host memory and time of loading one model on 4 CPU ranks: memory-efficient (shared mapping) vs plain.

    python -m benchmarks.loading              # ~300 MB synthetic FLUX.1-format model, 4 ranks, 1 round
    python -m benchmarks.loading --rounds 3   # interleaved rounds; medians

A Flux transformer of ~300 MB (fp32, random weights) plus the tiny test text encoders and VAE
is written to a temporary folder. Each measurement starts 4 fresh gloo ranks, lets them import
diffusers and build the mesh, then loads the pipeline on every rank at once (efficient:
meshdit's shared read-only mapping; plain: DiffusionPipeline.from_pretrained on every rank).
A sampler in this process sums the ranks' PSS (/proc/<pid>/smaps_rollup: shared pages counted
once, split between the processes that map them) every 20 ms; the figure is the peak of that
sum during the load minus the sum just before it: the host memory the load costs the job.
Each rank reads every weight after loading (mapped pages count only once read), and the
times include that read.
"""
from __future__ import annotations

import argparse
import statistics
import tempfile
import threading
import time

WORLD = 4


def _pss_bytes(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/smaps_rollup") as f:
            for line in f:
                if line.startswith("Pss:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


class PssSampler:
    """Sums the PSS of `pids` every `period` seconds on a thread; keeps (time, bytes) samples."""

    def __init__(self, pids: list[int], period: float = 0.02) -> None:
        self.pids, self.period, self.samples = pids, period, []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            self.samples.append((time.time(), sum(_pss_bytes(p) for p in self.pids)))
            time.sleep(self.period)

    def __enter__(self):
        self._thread.start()
        time.sleep(0.2)
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()


def write_model(folder: str) -> int:
    """A FLUX.1-format pipeline folder with a ~300 MB transformer; returns the transformer's bytes."""
    import torch
    from diffusers import FluxTransformer2DModel

    from meshdit.testing.tiny_models import tiny_pipeline

    pipe = tiny_pipeline("flux")
    torch.manual_seed(0)
    pipe.transformer = FluxTransformer2DModel(
        in_channels=16, num_layers=1, num_single_layers=2, attention_head_dim=128, num_attention_heads=8,
        joint_attention_dim=32, pooled_projection_dim=16, axes_dims_rope=(16, 56, 56)).eval()
    pipe.register_modules(transformer=pipe.transformer)
    pipe.save_pretrained(folder)
    return sum(p.numel() * p.element_size() for p in pipe.transformer.parameters())


def _warm() -> None:
    """Imports what loading imports (the pipeline, text encoder and VAE classes), so the figure is weights only."""
    import diffusers  # noqa: F401
    from diffusers import AutoencoderKL, FluxPipeline, FluxTransformer2DModel  # noqa: F401
    from transformers import CLIPTextModel, T5EncoderModel  # noqa: F401

    from meshdit.config import ParallelConfig
    from meshdit.testing.rank_pool import mesh_for

    mesh_for(ParallelConfig(ulysses_degree=WORLD))


def _load(folder: str, efficient: bool, dtype_name: str) -> tuple[float, float, float]:
    """Loads the pipeline on this rank and reads every weight; returns (start, end, checksum), holding it 0.5 s."""
    import torch

    from meshdit.config import ParallelConfig
    from meshdit.loading import LoadOptions
    from meshdit.loading.entry import load_pipeline
    from meshdit.testing.rank_pool import mesh_for

    mesh = mesh_for(ParallelConfig(ulysses_degree=WORLD))
    start = time.time()
    pipe = load_pipeline(folder, torch.device("cpu"), getattr(torch, dtype_name), mesh, LoadOptions(memory_efficient=efficient))
    # Mapped weights cost nothing until read: read every one, as the first denoising step does,
    # into a checksum the ranks must agree on. Summed in 1 MiB slices: a whole-parameter float64
    # copy would add up to 80 MiB per rank to both rows, which is the benchmark's, not the load's.
    touched = sum(float(piece.sum(dtype=torch.float64))
                  for p in pipe.transformer.parameters() for piece in p.detach().reshape(-1).split(2**18))
    end = time.time()
    time.sleep(0.5)  # the sampler sees the loaded state too
    del pipe
    return start, end, touched


def measure(folder: str, efficient: bool, dtype_name: str) -> tuple[int, float]:
    # NOTE: plain loads of this fp32 file map it too (diffusers/safetensors), so the gap is in what
    # each rank copies: run it to see, rather than assume 4x.
    """(peak host bytes the load adds to the job, load seconds) on 4 fresh ranks."""
    from meshdit.testing.rank_pool import RankPool

    pool = RankPool(WORLD)
    try:
        pool.run(_warm)
        with PssSampler([p.pid for p in pool._procs]) as sampler:
            times = pool.run(_load, folder, efficient, dtype_name)
    finally:
        pool.close()
    start, end = min(t[0] for t in times), max(t[1] for t in times)
    before = [b for t, b in sampler.samples if t <= start]
    during = [b for t, b in sampler.samples if start <= t <= end + 0.5]
    if len({round(t[2], 3) for t in times}) != 1:
        raise SystemExit(f"ranks loaded different weights: {[t[2] for t in times]}")
    return max(during) - before[-1], end - start


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--dtype", default="float32", choices=("float32", "bfloat16"),
                        help="the working dtype (the file is fp32: bfloat16 makes every rank cast)")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="meshdit-loading-") as folder:
        model_bytes = write_model(folder)
        rows = {True: [], False: []}
        for _ in range(args.rounds):
            for efficient in (True, False):
                rows[efficient].append(measure(folder, efficient, args.dtype))
    mib = 2**20
    print(f"transformer: {model_bytes / mib:.0f} MiB on disk (fp32); {WORLD} CPU ranks; loaded as {args.dtype}; {args.rounds} round(s)")
    print("| load | peak host memory of the job (PSS sum) | × model bytes | load time |")
    print("|---|---|---|---|")
    medians = {}
    for efficient, label in ((True, "memory-efficient (shared mapping)"), (False, "plain from_pretrained")):
        peak = statistics.median(r[0] for r in rows[efficient])
        seconds = statistics.median(r[1] for r in rows[efficient])
        medians[efficient] = seconds
        print(f"| {label} | {peak / mib:.0f} MiB | {peak / model_bytes:.2f} | {seconds:.2f} s |")
    print(f"load time efficient / plain: {medians[True] / medians[False]:.2f}")


if __name__ == "__main__":
    main()
