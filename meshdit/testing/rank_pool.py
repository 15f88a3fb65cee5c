"""A persistent pool of gloo ranks that runs one function on every rank.

Spawning a rank costs seconds (importing torch), so tests share one pool per
world size. A job that raises on any rank, or runs past its timeout, tears the
pool down (the next job starts a fresh one) and raises with every failing rank's
traceback, so nothing hangs and no stale state leaks into the next test.
"""
from __future__ import annotations

import multiprocessing as mp
import os
import shutil
import tempfile
import time
import traceback
from typing import Any, Callable

from ..distributed.hard_exit import hard_exit
from ..distributed.ports import free_port
from ..errors import RankFailedError

_GRACE_AFTER_FAILURE_S = 5.0


def _worker(rank: int, world_size: int, port: int, conn, temp_dir: str) -> None:
    tempfile.tempdir = temp_dir  # the pool's own folder: removed on close, even after a kill
    os.environ.update(
        RANK=str(rank), WORLD_SIZE=str(world_size), LOCAL_RANK=str(rank),
        MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port),
        MESHDIT_COLLECTIVE_TIMEOUT=os.environ.get("MESHDIT_COLLECTIVE_TIMEOUT", "120"),
    )
    import torch

    from ..distributed.mesh import init_distributed, teardown_distributed

    torch.set_num_threads(1)
    init_distributed(torch.device("cpu"))
    try:
        while True:
            job = conn.recv()
            if job is None:
                break
            fn, args, kwargs = job
            try:
                conn.send(("ok", fn(*args, **kwargs)))
            except BaseException:  # noqa: BLE001 - reported to the parent, which fails the job
                conn.send(("error", traceback.format_exc()))
    finally:
        teardown_distributed()
        hard_exit(0)  # gloo may abort in interpreter teardown; we are done


class RankPool:
    """`world_size` gloo ranks on this machine, reused across jobs."""

    def __init__(self, world_size: int) -> None:
        self.world_size = world_size
        self._procs: list = []
        self._conns: list = []
        self._temp_dir: str | None = None

    def _start(self) -> None:
        ctx = mp.get_context("spawn")
        port = free_port()
        self._temp_dir = tempfile.mkdtemp(prefix="meshdit-pool-")
        for rank in range(self.world_size):
            parent, child = ctx.Pipe()
            proc = ctx.Process(target=_worker, args=(rank, self.world_size, port, child, self._temp_dir), daemon=True)
            proc.start()
            self._procs.append(proc)
            self._conns.append(parent)

    def run(self, fn: Callable, *args: Any, timeout: float = 300.0, **kwargs: Any) -> list[Any]:
        """Runs fn(*args, **kwargs) on every rank; returns the per-rank results."""
        if not self._procs:
            self._start()
        for conn in self._conns:
            conn.send((fn, args, kwargs))
        results: dict[int, Any] = {}
        errors: dict[int, str] = {}
        deadline = time.monotonic() + timeout
        pending = set(range(self.world_size))
        while pending:
            now = time.monotonic()
            if now >= deadline:
                break
            for rank in sorted(pending):
                conn = self._conns[rank]
                if conn.poll(0.02):
                    try:
                        status, value = conn.recv()
                    except (EOFError, OSError):
                        status, value = "error", f"rank {rank} died (exit code {self._procs[rank].exitcode})"
                    (results if status == "ok" else errors)[rank] = value
                    pending.discard(rank)
                elif not self._procs[rank].is_alive():
                    errors[rank] = f"rank {rank} died (exit code {self._procs[rank].exitcode})"
                    pending.discard(rank)
            if errors and pending:  # the others may wait on the failed rank: short grace
                deadline = min(deadline, time.monotonic() + _GRACE_AFTER_FAILURE_S)
        if errors or pending:
            self.close(force=True)
            parts = [f"--- rank {r} raised:\n{tb}" for r, tb in sorted(errors.items())]
            if pending:
                why = (f"still running {_GRACE_AFTER_FAILURE_S:.0f} s after the failure (stopped)" if errors
                       else f"did not finish within the timeout ({timeout:.0f} s)")
                parts.append(f"--- ranks {sorted(pending)} {why}")
            failed = sorted(errors) or sorted(pending)
            raise RankFailedError(f"{fn.__name__} failed on rank(s) {failed}:\n" + "\n".join(parts))
        return [results[r] for r in range(self.world_size)]

    def close(self, force: bool = False) -> None:
        for conn in self._conns:
            try:
                if not force:
                    conn.send(None)
            except (BrokenPipeError, OSError):
                pass
        for proc in self._procs:
            proc.join(timeout=0 if force else 10)
            if proc.is_alive():
                proc.kill()
                proc.join(timeout=5)
        self._procs, self._conns = [], []
        if self._temp_dir is not None:  # what killed workers could not remove (their pymp-* folders)
            shutil.rmtree(self._temp_dir, ignore_errors=True)
            self._temp_dir = None


_POOLS: dict[int, RankPool] = {}


def get_pool(world_size: int) -> RankPool:
    """The shared pool of this size (started on first use)."""
    if world_size not in _POOLS:
        _POOLS[world_size] = RankPool(world_size)
    return _POOLS[world_size]


def close_all_pools() -> None:
    for pool in _POOLS.values():
        pool.close()
    _POOLS.clear()


_MESHES: dict = {}


def mesh_for(config, device=None):
    """A ParallelMesh for this config, built once per pool rank (groups are costly to make)."""
    import torch

    from ..distributed.mesh import ParallelMesh

    key = tuple(config.degrees.values())
    if key not in _MESHES:
        _MESHES[key] = ParallelMesh.build(config, device or torch.device("cpu"))
    else:
        _MESHES[key].config = config
    return _MESHES[key]


PER_REQUEST = ("warmup_steps", "num_pipeline_patch", "kv_drift_correction", "cache")
"""Layout dicts of the tests and benchmarks may name PipeFusion's run-time settings beside the degrees."""


def split_layout(layout: dict):
    """A layout dict, e.g. dict(pipefusion_parallel_degree=2, warmup_steps=1) -> (ParallelConfig, the
    GenerateRequest fields it names)."""
    from ..config import ParallelConfig

    per_request = {k: v for k, v in layout.items() if k in PER_REQUEST}
    return ParallelConfig(**{k: v for k, v in layout.items() if k not in PER_REQUEST}), per_request
