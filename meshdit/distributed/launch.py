"""Starting ranks: spawn them on this machine, or join a world torchrun already made.

Whatever happens on one rank ends all of them promptly: a rank that raises, a
rank that dies, or Ctrl-C. The error names the rank.
"""
from __future__ import annotations

import os
import shutil
import sys
import tempfile
import time
import traceback
from typing import Any, Callable

import torch.multiprocessing as mp

from ..errors import ConfigError, RankFailedError


def under_torchrun() -> bool:
    """True when torchrun (or another launcher) has set up this process as one rank."""
    return "TORCHELASTIC_RUN_ID" in os.environ or all(k in os.environ for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK"))


def launch(entry: Callable[[Any], None], payload: Any, world_size: int) -> None:
    """Runs entry(payload) on `world_size` ranks and returns when every rank has finished.

    Under torchrun this process is one of the ranks, and the world must already
    have `world_size` ranks. Otherwise ranks are spawned here (one process
    in-place when world_size is 1).
    """
    if under_torchrun():
        have = int(os.environ["WORLD_SIZE"])
        if have != world_size:
            raise ConfigError(
                f"torchrun started {have} ranks but the degrees multiply to {world_size}: change "
                f"--nproc-per-node/--nnodes so that they give {world_size} ranks, or change the degrees.")
        _run_rank(entry, payload)
        return
    if world_size == 1:
        os.environ.update(RANK="0", WORLD_SIZE="1", LOCAL_RANK="0")
        _run_rank(entry, payload)
        return
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ["MASTER_PORT"] = os.environ.get("MASTER_PORT") or str(_free_port())
    failures = tempfile.mkdtemp(prefix="meshdit-failures-")
    context = mp.start_processes(_rank_main, args=(world_size, entry, payload, failures), nprocs=world_size,
                                 join=False, start_method="spawn")
    try:
        while not context.join(timeout=0.5):
            pass
    except (mp.ProcessRaisedException, mp.ProcessExitedException) as exc:
        raise RankFailedError(_first_failure(failures, exc)) from None
    except KeyboardInterrupt:
        _stop(context)
        raise
    finally:
        shutil.rmtree(failures, ignore_errors=True)


def _stop(context) -> None:
    """Ends every rank process: politely first, then for good."""
    for proc in context.processes:
        if proc.is_alive():
            proc.terminate()
    for proc in context.processes:
        proc.join(timeout=5)
        if proc.is_alive():
            proc.kill()


def _run_rank(entry: Callable[[Any], None], payload: Any, failures: str | None = None) -> None:
    """entry(payload) on this rank; a failure is recorded (time-stamped, before teardown) and re-raised."""
    from .mesh import teardown_distributed

    rank = os.environ.get("RANK", "0")
    try:
        entry(payload)
    except KeyboardInterrupt:
        raise
    except BaseException:
        failed_at = time.time()
        text = traceback.format_exc()
        sys.stderr.write(f"[rank {rank}] {text}")
        sys.stderr.flush()
        if failures:
            with open(os.path.join(failures, f"rank{rank}"), "w") as f:
                f.write(f"{failed_at!r}\n{text}")
        raise
    finally:
        teardown_distributed()
        sys.stdout.flush()
        sys.stderr.flush()


def _rank_main(rank: int, world_size: int, entry: Callable[[Any], None], payload: Any, failures: str) -> None:
    os.environ.update(RANK=str(rank), WORLD_SIZE=str(world_size), LOCAL_RANK=str(rank))
    try:
        _run_rank(entry, payload, failures)
    except KeyboardInterrupt:
        os._exit(130)


def _first_failure(failures: str, exc: Exception) -> str:
    """Names the rank that failed first: the others usually fail because it left their collectives."""
    time.sleep(0.5)  # let ranks that fail in consequence write their records
    records = []
    for name in os.listdir(failures):
        with open(os.path.join(failures, name)) as f:
            stamp, _, text = f.read().partition("\n")
        records.append((float(stamp), int(name[4:]), text))
    if not records:
        return f"rank {getattr(exc, 'error_index', '?')} died ({exc}); the other ranks were stopped"
    records.sort()
    _, rank, text = records[0]
    others = sorted(r for _, r, _ in records[1:])
    also = f" (ranks {others} failed after it)" if others else ""
    return f"rank {rank} failed first{also}; the other ranks were stopped:\n{text.rstrip()}"


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
