"""Compiled blocks vs eager on the benchmark model: `python -m benchmarks.compile [--tokens 1024] [--rounds 5]`.

For serial, ulysses 2 and ring 2 (2 gloo ranks x 1 thread; serial runs on rank 0 while rank 1 waits),
prints the steady-state time of one denoising step eager and with --compile (inductor by default; the
two engines timed in alternation, medians of the rounds), their ratio, the seconds the first compiled generate spent compiling (its time minus a steady compiled one), the
graphs per block call, and the largest difference of the compiled image from the eager one. Each method
runs in fresh rank processes with an empty inductor cache directory, so its compile seconds are cold.

`python -m benchmarks.compile --flux-dev` runs the comparison at FLUX.1-dev size (random bfloat16
weights, 1024 x 1024, 512 text tokens) on one GPU instead: per-step seconds eager, then compiled, the
compile seconds and the images' difference (`--tiny` shrinks the model: a CPU check of that path).
"""
from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
import warnings

METHODS = {"serial": {}, "ulysses2": dict(ulysses_degree=2), "ring2": dict(ring_degree=2)}


def _step_seconds(engine, request) -> float:
    """Denoise seconds / steps of one generate; the slower rank's (a rank without an engine gives 0)."""
    import torch
    import torch.distributed as dist

    dist.barrier()
    seconds = engine.generate(request).seconds["denoise"] / request.num_inference_steps if engine else 0.0
    t = torch.tensor([seconds], dtype=torch.float64)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return float(t.item())


def compile_job(method: str, tokens: int, steps: int, rounds: int, backend: str) -> dict:
    """One method on every rank of the pool: an eager and a compiled engine on copies of the same weights,
    timed in alternation (so a busy machine slows both alike); medians over rounds."""
    warnings.filterwarnings("ignore")
    import torch
    import torch.distributed as dist

    from meshdit.config import ParallelConfig
    from meshdit.engine import Engine
    from meshdit.parallel.compile import compile_blocks
    from meshdit.testing.rank_pool import mesh_for

    from .jobs import _request
    from .models import FULL, flux_pipeline

    torch._dynamo.reset()
    serial = method == "serial"
    runs = dist.get_rank() == 0 or not serial  # serial: rank 1 only joins the barriers
    request = _request(tokens, 64, steps, cfg=False)
    handles = []  # serial: the compiled blocks (no mesh, so no parallelize; the API's regional compilation)

    def engine_for(compile_backend):
        if not runs:
            return None
        pipe = flux_pipeline(FULL)  # same seed: same weights
        if serial:
            engine = Engine(pipe)
            if compile_backend:
                handles.extend(compile_blocks(pipe.transformer, engine.info.family.plan().stages, compile_backend))
            return engine
        return Engine(pipe, mesh_for(ParallelConfig(**METHODS[method], compile=compile_backend)))

    eager, compiled = engine_for(None), engine_for(_Counted.register(backend))
    calls = _count_block_calls(compiled) if compiled else [0]  # before compiling: hooks are traced too
    eager_image = eager.generate(request).images if eager else None  # warm-up
    dist.barrier()
    start = time.perf_counter()
    compiled_image = compiled.generate(request).images if compiled else None
    first = time.perf_counter() - start
    calls[0] = _Counted.runs = 0
    times = {"eager": [], "compiled": []}
    for _ in range(rounds):
        times["eager"].append(_step_seconds(eager, request))
        times["compiled"].append(_step_seconds(compiled, request))
    out = {"method": method, "eager_step_s": statistics.median(times["eager"]),
           "compiled_step_s": statistics.median(times["compiled"]), "times": times}
    out["graphs_per_block_call"] = _Counted.runs / calls[0] if compiled else None
    out["compile_s"] = first - out["compiled_step_s"] * steps
    if compiled:
        out["max_abs_diff"] = float(abs(compiled_image - eager_image).max())
        for handle in handles:
            handle.remove()
        eager.close()
        compiled.close()
    return out


class _Counted:
    """A torch.compile backend: `backend`'s compiled graphs, each run counted (graphs per block call)."""

    runs = 0

    @classmethod
    def register(cls, backend: str) -> str:
        import torch
        from torch._dynamo.backends.registry import lookup_backend

        name = f"counted_{backend}"
        if name not in torch._dynamo.list_backends(exclude_tags=()):
            def compiler(gm, example_inputs):
                compiled = lookup_backend(backend)(gm, example_inputs)

                def run(*args):
                    cls.runs += 1
                    return compiled(*args)
                return run
            torch._dynamo.register_backend(compiler_fn=compiler, name=name)
        return name


def _count_block_calls(engine) -> list[int]:
    from meshdit.parallel.compile import blocks_of

    calls = [0]
    for block in blocks_of(engine.pipe.transformer, engine.info.family.plan().stages):
        block.register_forward_pre_hook(lambda *_: calls.__setitem__(0, calls[0] + 1))
    return calls


def flux_dev_compile(steps: int = 10, rounds: int = 3, backend: str = "inductor", tiny: bool = False) -> dict:
    """FLUX.1-dev shape on one GPU (tiny: a shrunken model on the CPU): per-step seconds eager and with every
    block compiled (regional, as --compile), the seconds the first compiled generate spent compiling, and the
    largest difference between the two images. A step's seconds are (T(2n steps) - T(n steps)) / n, so the
    text encoding and the VAE decode, the same in both generates, cancel."""
    import torch

    from meshdit.config import GenerateRequest
    from meshdit.engine import Engine
    from meshdit.parallel.compile import compile_blocks

    from .overhead import PROMPT, _sync, flux_dev_pipeline

    if not tiny and not torch.cuda.is_available():
        return {"skipped": "torch.cuda.is_available() is False on this machine: no FLUX.1-dev compile figure"}
    device = torch.device("cpu") if tiny else torch.device("cuda", 0)
    torch._dynamo.reset()
    pipe = flux_dev_pipeline(device, tiny=tiny)
    engine = Engine(pipe)
    px, text_tokens = (64, 16) if tiny else (1024, 512)

    def generate(n: int):
        request = GenerateRequest(prompt=PROMPT, height=px, width=px, num_inference_steps=n, seed=0,
                                  guidance_scale=3.5, extra={"max_sequence_length": text_tokens})
        _sync(device)
        start = time.perf_counter()
        images = engine.generate(request, output_type="np").images
        _sync(device)
        return time.perf_counter() - start, images

    def step_seconds() -> float:
        return (generate(2 * steps)[0] - generate(steps)[0]) / steps

    generate(steps)  # warm-up: allocator, kernel choices
    _, eager_image = generate(steps)
    eager = [step_seconds() for _ in range(rounds)]
    handles = compile_blocks(pipe.transformer, engine.info.family.plan().stages, backend)
    try:
        first, compiled_image = generate(steps)
        steady, _ = generate(steps)
        compiled = [step_seconds() for _ in range(rounds)]
    finally:
        for handle in handles:
            handle.remove()
        engine.close()
    out = {"device": "cpu (tiny model)" if tiny else torch.cuda.get_device_name(device), "px": px, "steps": steps,
           "rounds": rounds, "eager_step_s": statistics.median(eager), "compiled_step_s": statistics.median(compiled),
           "compile_s": first - steady, "max_abs_diff": float(abs(compiled_image - eager_image).max())}
    out["speedup"] = out["eager_step_s"] / out["compiled_step_s"]
    return out


def _print_flux_dev(args) -> None:
    r = flux_dev_compile(args.steps or 10, args.rounds or 3, args.backend, args.tiny)
    if "skipped" in r:
        print(f"skipped: {r['skipped']}")
        return
    n = r["steps"]
    print(f"FLUX.1-dev shape{' (tiny)' if args.tiny else ''}, random bf16 weights, {r['px']}x{r['px']}, {r['device']}, "
          f"backend {args.backend}; a step = (T({2 * n} steps) - T({n} steps)) / {n}, median of {r['rounds']}: "
          f"eager {r['eager_step_s']:.4f} s, compiled {r['compiled_step_s']:.4f} s, speed-up {r['speedup']:.2f}x, "
          f"compile {r['compile_s']:.1f} s (first generate), max abs image diff {r['max_abs_diff']:.2g}")


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=1024, help="image tokens (a square; default 1024)")
    parser.add_argument("--steps", type=int, default=None,
                        help="denoising steps per generate (default 4; --flux-dev 10)")
    parser.add_argument("--rounds", type=int, default=None,
                        help="timed generates per setting (default 5; --flux-dev 3)")
    parser.add_argument("--backend", default="inductor", help="torch.compile backend (default inductor)")
    parser.add_argument("--methods", nargs="+", default=list(METHODS), choices=list(METHODS))
    parser.add_argument("--flux-dev", action="store_true", help="FLUX.1-dev size on one GPU instead")
    parser.add_argument("--tiny", action="store_true", help="with --flux-dev: a shrunken model on the CPU")
    args = parser.parse_args(argv)
    if args.flux_dev:
        _print_flux_dev(args)
        return
    steps, rounds = args.steps or 4, args.rounds or 5
    os.environ.setdefault("MESHDIT_COLLECTIVE_TIMEOUT", "1800")  # a rank may wait while the other compiles
    from meshdit.testing.rank_pool import RankPool

    print(f"benchmark model flux-7m, {args.tokens} image tokens + 64 text, fp32, {steps} steps, "
          f"median of {rounds}; backend {args.backend}; 2 gloo ranks x 1 thread; load {os.getloadavg()[0]:.2f}")
    print("| method | eager s/step | compiled s/step | speed-up | compile s (first generate) | graphs per block |"
          " max abs diff |")
    print("|---|---|---|---|---|---|---|")
    for method in args.methods:
        # fresh rank processes and inductor cache per method: every compilation is cold; the cache goes after
        with tempfile.TemporaryDirectory(prefix="meshdit-inductor-") as cache:
            os.environ["TORCHINDUCTOR_CACHE_DIR"] = cache  # the ranks inherit it
            pool = RankPool(2)
            try:
                r = pool.run(compile_job, method, args.tokens, steps, rounds, args.backend, timeout=3600)[0]
            finally:
                pool.close()
                del os.environ["TORCHINDUCTOR_CACHE_DIR"]
        print(f"| {method} | {r['eager_step_s']:.3f} | {r['compiled_step_s']:.3f} | "
              f"{r['eager_step_s'] / r['compiled_step_s']:.2f}x | {r['compile_s']:.1f} | "
              f"{r['graphs_per_block_call']:.0f} | {r['max_abs_diff']:.1e} |", flush=True)


if __name__ == "__main__":
    main()
