"""Rank-side job of the scaling, communication and memory sections.

Runs on every rank of a 2-rank gloo pool (one thread per rank). The pool pickles
the job by name, so everything here is module-level. Models and engines are
built once per rank process and reused for every token count.

Timing: each round runs the serial baseline(s) on rank 0 alone (rank 1 waits in
a barrier), the same serial work on both ranks at once with no communication
(the machine's ceiling: what no 2-rank method can beat here), and every parallel
configuration on both ranks, in an order rotated each round; a configuration's
time for a round is the slower rank's. Medians over rounds are taken by the caller.
"""
from __future__ import annotations

import copy
import time
import warnings

import torch
import torch.distributed as dist

from meshdit.config import GenerateRequest, ParallelConfig
from meshdit.distributed.comm import comm_stats
from meshdit.engine import Engine
from meshdit.errors import ConfigError
from meshdit.memory import PeakAllocations
from meshdit.quant.settings import Fp8Config
from meshdit.denoising.recipe import COND
from meshdit.testing.rank_pool import mesh_for

from .diffusers_cp import count_functional_collectives, enable_context_parallel
from .methods import METHODS, Method
from .models import FULL, QUICK, flux_pipeline, param_bytes, pixels_for_tokens, with_transformer_copy

PROMPT = "a red cat on a blue square"
STEP_STEPS = 2  # denoising steps of a "step"-unit run; bytes per step = bytes(2 steps) - bytes(1 step)
QUICK_MAX_STEPS = 3  # --quick caps a method's own step count (PipeFusion's 20)
MEMORY_STEPS = 3  # a step-unit memory run: with PipeFusion's 1 warmup step, 2 patch steps (its stale K/V live)
_SETUPS: dict = {}


class _Setup:
    """One rank's models: the serial pipeline, and per method a meshdit engine and a diffusers transformer."""

    def __init__(self, size_name: str, method_names: list[str]) -> None:
        size = {"full": FULL, "quick": QUICK}[size_name]
        self.base = flux_pipeline(size)
        self.serial = Engine(self.base)
        self.methods: list[Method] = []
        self.meshdit: dict[str, Engine] = {}
        self.diffusers: dict[str, torch.nn.Module] = {}
        self.skipped: dict[str, str] = {}
        for m in METHODS:
            if m.name not in method_names:
                continue
            try:  # NOTE: validation is the same on every rank, so all ranks skip the same methods
                config = ParallelConfig(**m.meshdit)
                config.validate(dist.get_world_size())
                fp8 = Fp8Config(**m.fp8) if m.fp8 else None
                engine = Engine(with_transformer_copy(self.base), mesh_for(config), fp8=fp8)
            except (ConfigError, NotImplementedError) as exc:
                self.skipped[m.name] = f"{type(exc).__name__}: {exc}"
                continue
            self.methods.append(m)
            self.meshdit[m.name] = engine
            if m.diffusers is not None:
                transformer = copy.deepcopy(self.base.transformer)
                enable_context_parallel(transformer, **m.diffusers)  # NOTE: builds a mesh: all ranks, same order
                self.diffusers[m.name] = transformer


def _request(tokens: int, text_tokens: int, steps: int, cfg: bool, **settings) -> GenerateRequest:
    px = pixels_for_tokens(tokens)
    return GenerateRequest(prompt=PROMPT, height=px, width=px, num_inference_steps=steps, seed=0,
                           guidance_scale=3.0 if cfg else 1.0, extra={"max_sequence_length": text_tokens},
                           **settings)


def _slowest(seconds: float) -> float:
    t = torch.tensor([seconds], dtype=torch.float64)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return float(t.item())


def _max_abs_diff(a, b) -> float:
    return float((torch.as_tensor(a).float() - torch.as_tensor(b).float()).abs().max())


def scaling_job(size_name: str, method_names: list[str], tokens: int, text_tokens: int, rounds: int) -> dict:
    warnings.filterwarnings("ignore")
    phase = _Phases()
    if size_name not in _SETUPS:
        _SETUPS[size_name] = _Setup(size_name, method_names)
    setup = _SETUPS[size_name]
    rank = dist.get_rank()
    out: dict = {"rank": rank, "skipped": dict(setup.skipped), "times": {}, "max_abs_diff": {}, "bytes": {},
                 "memory": {}, "waiting_rank_cpu_fraction": [], "phase_seconds": phase.seconds}
    phase("setup")

    with torch.inference_mode():
        state = setup.serial.recipe.prepare(_request(tokens, text_tokens, 1, False), torch.Generator().manual_seed(0),
                                            torch.device("cpu"))
        inputs = setup.serial.recipe.model_inputs(state, state.latents, state.timesteps[0], COND)
    inputs["return_dict"] = False

    # label -> (ranks that run it, fn returning the result, fn returning the timed seconds)
    entries: dict[str, tuple] = {}

    def forward_entry(transformer, ranks, chunks=None):
        def run():
            from meshdit.attention import usp

            default, usp.ULYSSES_CHUNKS = usp.ULYSSES_CHUNKS, chunks or usp.ULYSSES_CHUNKS
            try:
                with torch.inference_mode():
                    return transformer(**inputs)[0]
            finally:
                usp.ULYSSES_CHUNKS = default

        def timed():
            start = time.perf_counter()
            run()
            return time.perf_counter() - start
        return ranks, run, timed

    def step_entry(engine, cfg, ranks, m=None):
        timed_steps = _timed_steps(m, size_name)

        def run(steps=timed_steps):
            return engine.generate(_request(tokens, text_tokens, steps, cfg, **(m.request if m else {})))

        def timed():
            return run().seconds["denoise"] / timed_steps
        return ranks, run, timed

    everyone, rank0 = (0, 1), (0,)
    for m in setup.methods:
        baseline = _baseline(m)
        if baseline not in entries:
            entries[baseline] = (forward_entry(setup.base.transformer, rank0) if m.unit == "forward"
                                 else step_entry(setup.serial, m.cfg, rank0))
            ceiling = baseline.replace("serial/", "ceiling/")
            entries[ceiling] = (forward_entry(setup.base.transformer, everyone) if m.unit == "forward"
                                else step_entry(setup.serial, m.cfg, everyone))
        engine = setup.meshdit[m.name]
        entries[f"{m.name}/meshdit"] = (forward_entry(engine.pipe.transformer, everyone, m.ulysses_chunks)
                                        if m.unit == "forward"
                                        else step_entry(engine, m.cfg, everyone, m))
        if m.name in setup.diffusers:
            entries[f"{m.name}/diffusers"] = forward_entry(setup.diffusers[m.name], everyone)

    # Warm-up, and the exactness check: every parallel result against the serial one (computed on every rank).
    refs = {}
    for label, (ranks, run, _) in entries.items():
        if label.startswith("serial"):
            refs[label] = run()
    for label, (ranks, run, _) in entries.items():
        if not _is_reference(label):
            result = run()
            m = _method_of(setup, label)
            ref = refs[_baseline(m)]
            if m.unit == "step" and _timed_steps(m, size_name) != STEP_STEPS:  # the serial image of as many steps
                ref = setup.serial.generate(_request(tokens, text_tokens, _timed_steps(m, size_name), m.cfg))
            out["max_abs_diff"][label] = (_max_abs_diff(result, ref) if isinstance(result, torch.Tensor)
                                          else _max_abs_diff(result.images, ref.images))

    phase("warmup")
    # Timed rounds, interleaved, order rotated every round.
    labels = list(entries)
    out["times"] = {label: [] for label in labels}
    for r in range(rounds):
        k = r % len(labels)
        for label in labels[k:] + labels[:k]:
            ranks, _, timed = entries[label]
            dist.barrier()
            cpu0, wall0 = time.process_time(), time.perf_counter()
            seconds = timed() if rank in ranks else 0.0
            dist.barrier()
            if rank not in ranks:  # how busy a waiting rank is while the other computes (gloo barrier: should be ~0)
                out["waiting_rank_cpu_fraction"].append((time.process_time() - cpu0) / (time.perf_counter() - wall0))
            out["times"][label].append(_slowest(seconds))

    phase("rounds")
    # Bytes sent by this rank per denoising step, counted at the collectives.
    for label, (ranks, run, _) in entries.items():
        if _is_reference(label):
            continue
        m = _method_of(setup, label)
        if label.endswith("/diffusers"):
            counts: dict[str, int] = {}
            with count_functional_collectives(lambda kind, n: counts.__setitem__(kind, counts.get(kind, 0) + n)):
                run()
            out["bytes"][label] = counts
        elif m.unit == "forward":
            comm_stats.reset()
            run()
            out["bytes"][label] = dict(comm_stats.bytes_sent)
        else:
            comm_stats.reset()
            run(2)
            two = dict(comm_stats.bytes_sent)
            comm_stats.reset()
            run(1)
            one = dict(comm_stats.bytes_sent)
            out["bytes"][label] = {kind: two.get(kind, 0) - one.get(kind, 0) for kind in set(two) | set(one)}
        comm_stats.reset()

    phase("bytes")
    # Memory: parameters held, and peak bytes allocated during one forward (or one MEMORY_STEPS-step generate).
    for label, (ranks, run, _) in entries.items():
        dist.barrier()
        if rank not in ranks or label.startswith("ceiling"):
            continue
        m = _method_of(setup, label)
        transformer = (setup.base.transformer if label.startswith("serial") else
                       setup.diffusers[m.name] if label.endswith("/diffusers") else setup.meshdit[m.name].pipe.transformer)
        with PeakAllocations() as counter:
            run() if m.unit == "forward" else run(MEMORY_STEPS)
        out["memory"][label] = {"param_bytes": param_bytes(transformer), "peak_activation_bytes": counter.peak_bytes}
    dist.barrier()
    phase("memory")
    return out


class _Phases:
    """phase(name) records the seconds since the previous call under name."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = {}
        self._last = time.perf_counter()

    def __call__(self, name: str) -> None:
        now = time.perf_counter()
        self.seconds[name] = round(now - self._last, 2)
        self._last = now


def _timed_steps(m: Method | None, size_name: str) -> int:
    """Denoising steps of a timed step-unit run of m (None: a serial baseline)."""
    if m is None or m.steps is None:
        return STEP_STEPS
    return min(m.steps, QUICK_MAX_STEPS) if size_name == "quick" else m.steps


def _is_reference(label: str) -> bool:
    """Serial baselines and the ceiling runs: the same serial work, no method under test."""
    return label.startswith(("serial/", "ceiling/"))


def _baseline(m: Method) -> str:
    return "serial/forward" if m.unit == "forward" else f"serial/step{'-cfg' if m.cfg else ''}"


def _method_of(setup: _Setup, label: str) -> Method:
    name = label.split("/")[0]
    if name == "serial":  # the first method measured against this baseline says its unit
        return next(m for m in setup.methods if _baseline(m) == label)
    return next(m for m in setup.methods if m.name == name)
