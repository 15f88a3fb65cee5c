"""Starting the serving ranks and watching them.

Unlike `meshdit generate`'s launcher, a failed rank does not make this process kill
the output rank at once: the output rank first answers 503 for a few seconds
(worker.DEAD_GRACE_S), then exits non-zero by itself. Ctrl-C / SIGTERM here are passed to the
output rank, which drains and stops every rank.
"""
from __future__ import annotations

import multiprocessing as mp
import os
import signal
import time

from ..distributed.blame import RankFailure, death
from ..distributed.hard_exit import hard_exit
from ..distributed.launch import check_torchrun_world, under_torchrun
from ..distributed.ports import free_port
from .server_state import ServeSettings

_STOP_GRACE_S = 15.0  # after the first rank exits, how long the others get to exit by themselves


def _rank_main(rank: int, world_size: int, settings: ServeSettings, reports) -> None:
    """reports: (rank, RankFailure) to the output rank, which names the rank to blame in its 503."""
    os.environ.update(RANK=str(rank), WORLD_SIZE=str(world_size), LOCAL_RANK=str(rank))
    import sys
    import traceback

    from .worker import run_serve

    code = 0
    try:
        run_serve(settings, reports if rank == 0 else None)
    except BaseException as exc:  # noqa: BLE001 - reported here; the exit status tells the launcher
        traceback.print_exc()
        reports.put((rank, RankFailure(time.time(), f"{type(exc).__name__}: {exc}".splitlines()[0],
                                       traceback.format_exc())))
        code = 1
    sys.stdout.flush()
    sys.stderr.flush()
    hard_exit(code)  # gloo teardown after the mesh stopped (or lost a peer) can hang; nothing is left to do


def serve_ranks(settings: ServeSettings) -> int:
    """Runs the server until it is stopped; returns the exit status (0 after a drain)."""
    world_size = settings.config.world_size
    check_torchrun_world(world_size)  # serve_command checked it already; API callers get it here
    if under_torchrun() or world_size == 1:
        if not under_torchrun():
            os.environ.update(RANK="0", WORLD_SIZE="1", LOCAL_RANK="0")
            settings.spawned = False
        from .worker import run_serve

        run_serve(settings)
        return 0
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ["MASTER_PORT"] = os.environ.get("MASTER_PORT") or str(free_port())
    ctx = mp.get_context("spawn")
    reports = ctx.SimpleQueue()  # ranks' errors and deaths, read by the output rank
    procs = [ctx.Process(target=_rank_main, args=(rank, world_size, settings, reports), name=f"meshdit-rank{rank}")
             for rank in range(world_size)]
    stopping = []

    def forward(signum, frame):  # the output rank drains, then tells the others to stop
        stopping.append(signum)
        if procs[0].pid:
            os.kill(procs[0].pid, signal.SIGTERM)

    old = {s: signal.signal(s, forward) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        for proc in procs:
            proc.start()
        return _watch(procs, reports)
    finally:
        for sig, handler in old.items():
            signal.signal(sig, handler)
        for proc in procs:
            if proc.is_alive():
                proc.kill()
            proc.join(timeout=5)


def _watch(procs, reports) -> int:
    """Waits for every rank; once one has exited, the rest get _STOP_GRACE_S, then are killed. A rank that ends
    non-zero is reported to the output rank (blame.death: its signal or exit code)."""
    first_exit = None
    reported = set()
    while any(p.is_alive() for p in procs):
        for rank, proc in enumerate(procs):
            if proc.exitcode not in (0, None) and rank not in reported:
                reported.add(rank)
                reports.put((rank, death(time.time(), proc.exitcode)))
        if first_exit is None and any(p.exitcode is not None for p in procs):
            first_exit = time.monotonic()
        if first_exit is not None and time.monotonic() - first_exit > _STOP_GRACE_S:
            break
        time.sleep(0.2)
    codes = [p.exitcode for p in procs]
    if all(code == 0 for code in codes):
        return 0
    failed = [f"rank {r} exit {c}" for r, c in enumerate(codes) if c not in (0, None)]
    print(f"meshdit: error: the server stopped after a rank failure ({', '.join(failed) or 'ranks hung'}); "
          "every rank was stopped", flush=True)
    return 1

