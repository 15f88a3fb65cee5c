"""`meshdit plan --calibrate`: this machine's figures for the cpu-here preset, measured, not assumed: one rank's
float32 matmul throughput (one thread, as generate's CPU ranks run), the fixed cost of a small call, and gloo's
latency and bandwidth between two ranks on loopback (ping-pong). Saved where hardware.calibration_path() says."""
from __future__ import annotations

import os
import statistics
import tempfile
import time

MATMUL_SIZE = 512
PING_SIZES = (1, 4 * 1024 * 1024)  # float32 elements: a latency probe and a bandwidth probe (16 MiB)
ROUNDS = 7


def median_seconds(fn, rounds: int = ROUNDS) -> float:
    fn()  # warm up
    times = []
    for _ in range(rounds):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def measure_compute() -> dict:
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        a, b = torch.randn(MATMUL_SIZE, MATMUL_SIZE), torch.randn(MATMUL_SIZE, MATMUL_SIZE)
        matmul_s = median_seconds(lambda: [a @ b for _ in range(8)]) / 8
        small = torch.nn.Linear(16, 16)
        x = torch.randn(1, 16)
        with torch.no_grad():
            call_s = median_seconds(lambda: [small(x) for _ in range(200)]) / 200
    finally:
        torch.set_num_threads(threads)
    return {"flops": 2 * MATMUL_SIZE ** 3 / matmul_s, "launch_s": call_s}


def _ping_pong(out_path: str) -> None:
    """Rank job: rank 0 sends, rank 1 echoes; rank 0 writes the one-way times per size."""
    import json

    import torch
    import torch.distributed as dist

    dist.init_process_group("gloo")
    try:
        rank = dist.get_rank()
        result = {}
        for n in PING_SIZES:
            buf = torch.zeros(n)

            def once():
                if rank == 0:
                    dist.send(buf, 1)
                    dist.recv(buf, 1)
                else:
                    dist.recv(buf, 0)
                    dist.send(buf, 0)

            result[n] = median_seconds(once) / 2
        if rank == 0:
            with open(out_path, "w", encoding="utf-8") as f:
                json.dump(result, f)
    finally:
        dist.destroy_process_group()


def measure_links() -> dict:
    import json

    from ..distributed.launch import launch

    fd, path = tempfile.mkstemp(prefix="meshdit-calibrate-", suffix=".json")
    os.close(fd)
    try:
        launch(_ping_pong, path, 2)
        with open(path, encoding="utf-8") as f:
            one_way = {int(k): v for k, v in json.load(f).items()}
    finally:
        os.unlink(path)
    small, large = PING_SIZES
    latency = one_way[small]
    bandwidth = large * 4 / max(one_way[large] - latency, 1e-9)
    return {"latency_s": latency, "bandwidth": bandwidth}


def calibrate() -> dict:
    from .hardware import save_calibration

    figures = {**measure_compute(), **measure_links(), "cpu_count": os.cpu_count(),
               "measured_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
    path = save_calibration(figures)
    print(f"meshdit plan: this machine: {figures['flops'] / 1e9:.2f} GFLOP/s per rank (float32 matmul, one thread), "
          f"{figures['launch_s'] * 1e6:.1f} us per small call, gloo {figures['latency_s'] * 1e6:.0f} us latency, "
          f"{figures['bandwidth'] / 1e9:.2f} GB/s; saved to {path} (the cpu-here preset reads it)")
    return figures
