"""`meshdit plan --calibrate`: this machine's figures for the cpu-here preset, measured, not assumed, with one thread
per rank as generate's CPU ranks run:
- throughput: a 512 x 512 float32 matmul, scaled dot-product attention, 3x3 (and 3x3x3, the video VAEs')
  convolutions at four channel counts, the decoder's norms per element;
- the fixed cost of a small operator call;
- gloo's latency and bandwidth between two idle ranks (ping-pong), and each collective a layout issues (exchange,
  all-to-all, all-reduce) at 2 and 4 ranks while the ranks compute between calls, as they do in a step;
- the engine's fixed costs per transformer call and per generate, what one Ulysses attention, ring step,
  tensor-parallel all-reduce and PipeFusion hand-off costs inside a real step, and a parallel decode's fixed cost:
  the bundled model on 1, 2 and 4 ranks at 1 and 5 steps under each method, less what the figures above predict
  for it (measure_engine).
Saved where hardware.calibration_path() says; docs/planner.md ("This machine") has the method and figures."""
from __future__ import annotations

import os
import statistics
import tempfile
import time
from dataclasses import replace

from ..mesh_axes import MeshAxis, axis

MATMUL_SIZE = 512
ATTENTION_SHAPE = (1, 4, 1024, 64)  # [B, H, S, D]
CONV_CHANNELS = (2, 4, 16, 128)  # small-channel convolutions run far below the matmul rate (4: ~6-15 GFLOP/s here)
CONV_PIXELS = 64  # a 64 x 64 feature map (3-D: one output frame from three)
PING_SIZES = (1, 4 * 1024 * 1024)  # float32 elements: a latency probe and a bandwidth probe (16 MiB)
COLLECTIVE_SIZES = (256, 1024 * 1024)  # float32 elements per rank: the per-call cost, and the bandwidth
COLLECTIVE_WORLDS = (2, 4)
CARRIERS = {"ulysses_attention": "all_to_all", "ring_step": "exchange", "pipefusion_hop": "exchange"}
"""meshdit's own calls and the collective that carries their bytes (its measured bandwidth is theirs)."""
COLLECTIVE_ROUNDS = 20
COLLECTIVE_REPEATS = 5
"""Each collective is timed in this many runs of COLLECTIVE_ROUNDS (interleaved with runs of the burst alone); the
median difference is kept (a loaded moment moves one run, not the median)."""
ROUNDS = 7
ENGINE_ROUNDS = 7
LONG_STEPS = 4
"""The bundled model runs 1 and 1 + LONG_STEPS steps; a step's time is their difference / LONG_STEPS."""


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
    import torch.nn.functional as F

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        with torch.no_grad():
            a, b = torch.randn(MATMUL_SIZE, MATMUL_SIZE), torch.randn(MATMUL_SIZE, MATMUL_SIZE)
            matmul_s = median_seconds(lambda: [a @ b for _ in range(8)]) / 8
            q, k, v = (torch.randn(ATTENTION_SHAPE) for _ in range(3))
            attention_s = median_seconds(lambda: F.scaled_dot_product_attention(q, k, v))
            _, heads, seq, dim = ATTENTION_SHAPE
            conv, conv3d = {}, {}
            for channels in CONV_CHANNELS:
                for table, layer, x, taps in (
                        (conv, torch.nn.Conv2d(channels, channels, 3, padding=1),
                         torch.randn(1, channels, CONV_PIXELS, CONV_PIXELS), 9),
                        (conv3d, torch.nn.Conv3d(channels, channels, 3, padding=(0, 1, 1)),
                         torch.randn(1, channels, 3, CONV_PIXELS, CONV_PIXELS), 27)):
                    conv_s = median_seconds(lambda: layer(x))
                    table[str(channels)] = 2 * taps * channels * channels * CONV_PIXELS ** 2 / conv_s
            # the decoder's norms: GroupNorm (2-D VAEs) and the video VAEs' RMS norm over channels, per element
            group_norm, x = torch.nn.GroupNorm(4, 16), torch.randn(1, 16, CONV_PIXELS, CONV_PIXELS)
            norm_s = median_seconds(lambda: group_norm(x)) / x.numel()
            x = torch.randn(1, 4, 3, CONV_PIXELS, CONV_PIXELS)
            norm3d_s = median_seconds(lambda: F.normalize(x, dim=1)) / x.numel()
            small = torch.nn.Linear(16, 16)
            x = torch.randn(1, 16)
            call_s = median_seconds(lambda: [small(x) for _ in range(200)]) / 200
    finally:
        torch.set_num_threads(threads)
    return {"flops": 2 * MATMUL_SIZE ** 3 / matmul_s, "attention_flops": 4 * heads * seq * seq * dim / attention_s,
            "conv_flops": conv, "conv3d_flops": conv3d, "norm_s_per_element": norm_s,
            "norm3d_s_per_element": norm3d_s, "launch_s": call_s}


def _ping_pong(payload: tuple) -> None:
    """Rank job: rank 0 sends, rank 1 echoes; rank 0 writes the one-way times per size."""
    import json

    import torch
    import torch.distributed as dist

    (out_path,) = payload
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


def _collectives_job(payload: tuple) -> None:
    """Rank job: per collective and size, rounds of (a short matmul burst, the collective) against rounds of the
    burst alone; the difference per round is the collective's cost as a step sees it. Rank 0 writes them."""
    import json

    import torch
    import torch.distributed as dist

    (out_path,) = payload
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    try:
        rank, world = dist.get_rank(), dist.get_world_size()
        a = torch.randn(256, 256)

        def run(collective) -> float:
            dist.barrier()
            start = time.perf_counter()
            for _ in range(COLLECTIVE_ROUNDS):
                for _ in range(4):  # about a millisecond of work, as a block's between its collectives
                    a @ a
                collective()
            dist.barrier()
            return (time.perf_counter() - start) / COLLECTIVE_ROUNDS

        def timed(collective) -> float:
            """The collective's cost per round over the burst's alone: the median of COLLECTIVE_REPEATS pairs."""
            for _ in range(3):
                a @ a
                collective()
            return statistics.median(run(collective) - run(lambda: None) for _ in range(COLLECTIVE_REPEATS))

        result = {}
        for n in COLLECTIVE_SIZES:
            x, y = torch.randn(n), torch.empty(n)

            def exchange():
                for request in (dist.isend(x, (rank + 1) % world), dist.irecv(y, (rank - 1) % world)):
                    request.wait()

            for kind, fn in (("exchange", exchange), ("all_to_all", lambda: dist.all_to_all_single(y, x)),
                             ("all_reduce", lambda: dist.all_reduce(x))):
                result.setdefault(kind, {})[n] = max(timed(fn), 1e-7)
        if rank == 0:
            with open(out_path, "w", encoding="utf-8") as f:
                json.dump(result, f)
    finally:
        dist.destroy_process_group()


def _run_ranks(job, payload: tuple, world: int):
    """Runs job(payload + (a temp file's path,)) on `world` ranks; what rank 0 wrote there."""
    import json

    from ..distributed.launch import launch

    fd, path = tempfile.mkstemp(prefix="meshdit-calibrate-", suffix=".json")
    os.close(fd)
    try:
        launch(job, payload + (path,), world)
        with open(path, encoding="utf-8") as f:
            return json.load(f)
    finally:
        os.unlink(path)


def measure_links() -> dict:
    one_way = {int(k): v for k, v in _run_ranks(_ping_pong, (), 2).items()}
    small, large = PING_SIZES
    latency = one_way[small]
    return {"latency_s": latency, "bandwidth": large * 4 / max(one_way[large] - latency, 1e-9)}


def measure_collectives() -> dict:
    """{world: {kind: [latency_s, bandwidth]}}, bandwidth over the bytes hardware.Collectives says each kind counts."""
    small, large = COLLECTIVE_SIZES
    table = {}
    for world in COLLECTIVE_WORLDS:
        measured = _run_ranks(_collectives_job, (), world)
        counted = {"exchange": 1.0, "all_to_all": (world - 1) / world, "all_reduce": 2 * (world - 1) / world}
        table[str(world)] = {}
        for kind in counted:
            latency, big = measured[kind][str(small)], measured[kind][str(large)]
            table[str(world)][kind] = [latency, (large - small) * 4 * counted[kind] / max(big - latency, 1e-9)]
        # meshdit's own calls start as the collective they move bytes with; measure_engine replaces their per-call
        # cost with what a real step shows
        for kind, carrier in CARRIERS.items():
            table[str(world)][kind] = list(table[str(world)][carrier])
    return table


def median_generate_seconds(engine, request, rounds: int) -> float:
    """The median of `rounds` generates, each started after a barrier of every rank (a rank job's helper)."""
    import torch.distributed as dist

    runs = []
    for _ in range(rounds):
        dist.barrier()
        start = time.perf_counter()
        engine.generate(request)
        runs.append(time.perf_counter() - start)
    return statistics.median(runs)


def _engine_job(payload) -> None:
    """Rank job: the bundled model under `settings`, each (request, parallel decode) timed (medians) on rank 0."""
    import json

    import torch.distributed as dist

    from ..rank import start_rank
    from ..vae.settings import VaeDecodeSettings

    settings, requests, out_path = payload
    engine = start_rank(settings).engine
    times = []
    for request, parallel_decode in requests:
        engine.vae = VaeDecodeSettings(parallel=parallel_decode)
        engine.generate(request)  # warm
        times.append(median_generate_seconds(engine, request, ENGINE_ROUNDS))
    if dist.get_rank() == 0:
        with open(out_path, "w", encoding="utf-8") as f:
            json.dump(times, f)


ENGINE_METHODS = {"ulysses_attention": MeshAxis.ULYSSES, "ring_step": MeshAxis.RING,
                  "all_reduce": MeshAxis.TP, "pipefusion_hop": MeshAxis.PP}
"""The collective whose per-call cost each run of the bundled model pins down, and the axis it runs on."""


def _calls_per_step(kind: str, ranks: int, blocks: int, patches: int) -> int:
    """Ulysses: one attention call per block; ring: ranks - 1 steps per block; tp: two all-reduces per block;
    PipeFusion: one hand-off per patch."""
    return {"ulysses_attention": blocks, "ring_step": blocks * (ranks - 1), "all_reduce": 2 * blocks,
            "pipefusion_hop": patches}[kind]


def measure_engine(figures: dict) -> dict:
    """The engine's own costs, from the bundled model (64 x 64 px, no CFG, plain decode) at 1 and 5 steps, less what
    the figures above predict for it:
    - one rank: the fixed cost per transformer call ((5 steps - 1 step) / 4 less a step's prediction) and per
      generate (the 1-step time less the rest);
    - 2 and 4 ranks, under Ulysses, ring, tensor parallelism and PipeFusion in turn: what one call of that
      method's collective costs inside a real step (the step's time less its prediction without that collective,
      over its calls), replacing the burst probe's figure; and the fixed cost per generate at that world size.
    - under PipeFusion, what one patch's hand-off costs inside a patch step;
    - and, under Ulysses, a 1-step generate with a parallel decode: the decode's fixed cost (on a 64 px image, the
      setup and every layer's halo exchange and norm all-reduce are all it adds).
    Returns {"engine_overheads": {ranks: [per call s, per generate s]}, "collectives": the table with those
    per-call costs}."""
    from ..config import GenerateRequest, ParallelConfig
    from ..default_model import weights_path
    from ..engine_settings import EngineSettings
    from ..vae.settings import VaeDecodeSettings
    from .choose import load_model
    from .hardware import cpu_here
    from .layouts import Layout
    from .predict import predict

    folder = str(weights_path())
    _, info, costs = load_model(folder)
    from ..request import resolve_request

    requests = [resolve_request(GenerateRequest(prompt="a red circle", height=64, width=64, num_inference_steps=steps,
                                                guidance_scale=1.0, seed=0, warmup_steps=1), info)
                for steps in (1, 1 + LONG_STEPS)]

    def timings(method_axis: MeshAxis | None, ranks: int) -> tuple[float, float, float | None, Layout]:
        """1 and 1 + LONG_STEPS steps with a plain decode, and (Ulysses) 1 step with a parallel one."""
        config = ParallelConfig(**({axis(method_axis).field: ranks} if method_axis else {}))
        decode = method_axis == ENGINE_METHODS["ulysses_attention"]
        runs = [(requests[0], False), (requests[1], False)] + ([(requests[0], True)] if decode else [])
        times = _run_ranks(_engine_job, (EngineSettings(folder, config, "float32",
                                                             VaeDecodeSettings(parallel=decode)), runs), ranks)
        layout = Layout.of(config)
        return times[0], times[1], times[2] if decode else None, layout

    def step_s(layout: Layout, world) -> float:
        """The predicted time of the LONG_STEPS steps the longer run adds, per step."""
        short, long = (predict(layout, costs, world, r).total_s for r in requests)
        return (long - short) / LONG_STEPS

    figures = {**figures, "engine_overheads": {}}
    one, many, _, layout = timings(None, 1)
    serial = predict(layout, costs, cpu_here(1, figures), requests[0])
    per_call = max(0.0, (many - one) / LONG_STEPS - step_s(layout, cpu_here(1, figures)))
    figures["engine_overheads"]["1"] = [per_call, max(0.0, one - per_call - serial.total_s)]
    table = {size: dict(kinds) for size, kinds in figures["collectives"].items()}
    for ranks in COLLECTIVE_WORLDS:
        figures["engine_overheads"][str(ranks)] = [per_call, figures["engine_overheads"]["1"][1]]
        for kind, method_axis in ENGINE_METHODS.items():
            one, many, parallel_decode, layout = timings(method_axis, ranks)
            bandwidth = table[str(ranks)][CARRIERS.get(kind, kind)][1]
            without = {**table, str(ranks): {**table[str(ranks)], kind: [0.0, bandwidth]}}
            world = cpu_here(ranks, {**figures, "collectives": without})
            predicted = predict(layout, costs, world, requests[0])
            calls = _calls_per_step(kind, ranks, len(costs.blocks), requests[0].patches(layout.parallel_config()))
            table[str(ranks)][kind] = [max(0.0, (many - one) / LONG_STEPS - step_s(layout, world)) / calls, bandwidth]
            if kind == "ulysses_attention":  # the fixed cost per generate at this world size (predict divides it
                # by World.share: it is stored as one rank alone would pay it)
                share = world.share(ranks)
                rest = predicted.total_s - step_s(layout, world) - world.generate_overhead_s / share
                figures["engine_overheads"][str(ranks)][1] = max(0.0, (one - (many - one) / LONG_STEPS - rest) * share)
                # a parallel decode's fixed cost: its extra time over the plain one, less the predicted change
                # without it (the convolutions it splits)
                free = {**table, str(ranks): {**table[str(ranks)], "parallel_decode": [0.0, 1.0]}}
                split = replace(layout, vae="parallel")
                both = [predict(x, costs, cpu_here(ranks, {**figures, "collectives": free}), requests[0]).total_s
                        for x in (split, layout)]
                table[str(ranks)]["parallel_decode"] = [max(0.0, parallel_decode - one - (both[0] - both[1])), 1.0]
    return {"engine_overheads": figures["engine_overheads"], "collectives": table}


def calibrate() -> dict:
    from .hardware import save_calibration

    figures = {**measure_compute(), **measure_links()}
    figures["collectives"] = measure_collectives()
    figures.update(measure_engine(figures))
    figures.update({"cpu_count": os.cpu_count(), "measured_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())})
    path = save_calibration(figures)
    per_call = "; ".join(
        f"{n} ranks: Ulysses attention {t['ulysses_attention'][0] * 1e3:.2f}, ring step {t['ring_step'][0] * 1e3:.2f}, "
        f"all-reduce {t['all_reduce'][0] * 1e3:.2f}, exchange {t['exchange'][0] * 1e3:.2f} ms"
        for n, t in figures["collectives"].items())
    fixed = ", ".join(f"{c * 1e3:.1f} / {g * 1e3:.1f} ms" for c, g in figures["engine_overheads"].values())
    print(f"meshdit plan: this machine: {figures['flops'] / 1e9:.2f} GFLOP/s per rank (float32 matmul, one thread), "
          f"attention {figures['attention_flops'] / 1e9:.2f} GFLOP/s, {figures['launch_s'] * 1e6:.1f} us per small "
          f"call, gloo {figures['latency_s'] * 1e6:.0f} us latency idle, {figures['bandwidth'] / 1e9:.2f} GB/s; "
          f"per call inside a step: {per_call}; the engine's fixed cost per transformer call / per generate at "
          f"{', '.join(figures['engine_overheads'])} ranks: {fixed}; saved to {path} (the cpu-here preset reads it)")
    return figures
