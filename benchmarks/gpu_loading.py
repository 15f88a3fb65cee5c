"""GPU check: host memory and per-GPU memory while loading a FLUX.1-dev-sized random model on every GPU.

    python -m benchmarks.gpu_loading                       # 19 double + 38 single blocks, bf16 (~23 GiB)
    python -m benchmarks.gpu_loading --double 2 --single 4 # a smaller model, same code path
    python -m benchmarks.gpu_loading --out results.json

Writes a FLUX.1-dev-shaped transformer with random bf16 weights (sharded safetensors, as on
the Hub) next to tiny text encoders and VAE, then for each mode (memory-efficient: rank 0
streams tensor by tensor; plain: from_pretrained on every rank) starts one rank per GPU, loads
the pipeline in bf16 and reports: the peak of the summed PSS of this process and its rank
processes during the load (minus before it), each rank's peak CUDA memory, and the load time.
With one GPU the efficient mode still runs its streaming path (one rank).
"""
from __future__ import annotations

import argparse
import json
import os
import tempfile
import threading
import time

FLUX_DEV = dict(in_channels=64, num_attention_heads=24, attention_head_dim=128, joint_attention_dim=4096,
                pooled_projection_dim=768, guidance_embeds=True, axes_dims_rope=(16, 56, 56))
SHARD_BYTES = 5 * 2**30


def _pss(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/smaps_rollup") as f:
            return next(int(line.split()[1]) * 1024 for line in f if line.startswith("Pss:"))
    except (OSError, StopIteration):
        return 0


def _descendants(root: int) -> list[int]:
    children: dict[int, list[int]] = {}
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                with open(f"/proc/{name}/stat") as f:
                    ppid = int(f.read().rsplit(")", 1)[1].split()[1])
            except (OSError, ValueError, IndexError):
                continue
            children.setdefault(ppid, []).append(int(name))
    found, todo = [], [root]
    while todo:
        pid = todo.pop()
        found.append(pid)
        todo += children.get(pid, [])
    return found


class JobPss:
    """Summed PSS of this process and its descendants, sampled on a thread."""

    def __init__(self, period: float = 0.1) -> None:
        self.period, self.samples, self._stop = period, [], threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            self.samples.append(sum(_pss(p) for p in _descendants(os.getpid())))
            time.sleep(self.period)

    def __enter__(self):
        self._thread.start()
        time.sleep(0.3)
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()


def write_model(folder: str, double: int, single: int) -> int:
    """The pipeline folder; returns the transformer's bytes on disk."""
    import torch
    from diffusers import FluxTransformer2DModel
    from safetensors.torch import save_file

    from meshdit.loading.skeleton import meta_parameters
    from meshdit.testing.tiny_models import tiny_pipeline

    tiny_pipeline("flux").save_pretrained(folder)  # tiny text encoders, VAE, tokenizers, scheduler
    out = os.path.join(folder, "transformer")
    for name in os.listdir(out):
        os.remove(os.path.join(out, name))
    with meta_parameters():
        model = FluxTransformer2DModel(num_layers=double, num_single_layers=single, **FLUX_DEV)
    model.save_config(out)
    generator = torch.Generator().manual_seed(0)
    shard, shard_bytes, weight_map, total, index = {}, 0, {}, 0, 0

    def flush():
        nonlocal shard, shard_bytes, index
        if shard:
            index += 1
            file = f"diffusion_pytorch_model-{index:05d}.safetensors"
            save_file(shard, os.path.join(out, file))
            weight_map.update({n: file for n in shard})
            shard, shard_bytes = {}, 0

    for name, tensor in model.state_dict().items():
        shard[name] = (torch.randn(tensor.shape, generator=generator) * 0.02).to(torch.bfloat16)
        shard_bytes += shard[name].numel() * 2
        total += shard[name].numel() * 2
        if shard_bytes >= SHARD_BYTES:
            flush()
    flush()
    with open(os.path.join(out, "diffusion_pytorch_model.safetensors.index.json"), "w") as f:
        json.dump({"metadata": {"total_size": total}, "weight_map": weight_map}, f)
    return total


def _rank(payload: dict) -> None:
    import torch
    import torch.distributed as dist

    from meshdit.config import ParallelConfig
    from meshdit.distributed.mesh import ParallelMesh, init_distributed
    from meshdit.loading import LoadOptions
    from meshdit.loading.entry import load_pipeline

    device = init_distributed()
    world = dist.get_world_size()
    mesh = ParallelMesh.build(ParallelConfig(data_parallel_degree=world), device)
    dist.barrier()
    start = time.time()
    pipe = load_pipeline(payload["folder"], device, torch.bfloat16, mesh,
                         LoadOptions(memory_efficient=payload["efficient"]))
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    seconds = time.time() - start
    dist.barrier()
    row = dict(rank=dist.get_rank(), seconds=seconds, device=str(device),
               peak_device_bytes=torch.cuda.max_memory_allocated(device) if device.type == "cuda" else 0,
               param_bytes=sum(p.numel() * p.element_size() for p in pipe.transformer.parameters()))
    with open(os.path.join(payload["results"], f"rank{row['rank']}.json"), "w") as f:
        json.dump(row, f)


def measure(folder: str, efficient: bool, world: int) -> dict:
    from meshdit.distributed.launch import launch

    with tempfile.TemporaryDirectory() as results, JobPss() as pss:
        launch(_rank, dict(folder=folder, efficient=efficient, results=results), world)
        ranks = [json.load(open(os.path.join(results, name))) for name in sorted(os.listdir(results))]
    return dict(efficient=efficient, world=world, host_peak_bytes=max(pss.samples) - pss.samples[0], ranks=ranks)


def main(argv: list[str] | None = None) -> None:
    import torch

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--double", type=int, default=19)
    parser.add_argument("--single", type=int, default=38)
    parser.add_argument("--world", type=int, default=max(torch.cuda.device_count(), 1))
    parser.add_argument("--folder", default=None, help="reuse a model folder written before")
    parser.add_argument("--out", default=None, help="also write the rows as JSON here")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="meshdit-gpu-loading-") as scratch:
        folder = args.folder or scratch
        start = time.time()
        model_bytes = write_model(folder, args.double, args.single) if not args.folder else None
        print(f"model written in {time.time() - start:.0f} s: {model_bytes and model_bytes / 2**30:.2f} GiB", flush=True)
        rows = [measure(folder, efficient, args.world) for efficient in (True, False)]
    gib = 2**30
    for row in rows:
        label = "memory-efficient" if row["efficient"] else "plain"
        devices = ", ".join(f"{r['peak_device_bytes'] / gib:.2f}" for r in row["ranks"])
        seconds = max(r["seconds"] for r in row["ranks"])
        print(f"{label}: {row['world']} rank(s), host peak {row['host_peak_bytes'] / gib:.2f} GiB, "
              f"per-GPU peak [{devices}] GiB, load {seconds:.1f} s", flush=True)
    if args.out:
        with open(args.out, "w") as f:
            json.dump(dict(model_bytes=model_bytes, rows=rows), f, indent=1)


if __name__ == "__main__":
    main()
