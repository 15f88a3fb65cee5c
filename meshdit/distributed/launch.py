"""Starting ranks: spawn them on this machine, or join a world torchrun already made.

Whatever happens on one rank ends all of them promptly: a rank that raises, a rank
that dies, a rank that freezes (heartbeats, watch.py), Ctrl-C or SIGTERM to the
launcher. The error names the failing rank (blame.py: a rank's own error, else a
rank that died and its signal, before the broken connections the others then see),
with its traceback once, and one line for each other rank. Nothing is left behind:
no temp folders, no error files, no processes (a rank whose launcher is killed exits on its own).

Ranks report over one pipe each (no multiprocessing queues or locks, whose
semaphores a killed rank would leak). This module imports no torch: a rank starts
its heartbeat before it unpickles the job, which imports torch and the model code.
"""
from __future__ import annotations

import multiprocessing
import multiprocessing.connection
import os
import pickle
import signal
import sys
import threading
import time
import traceback
from contextlib import contextmanager
from typing import Any, Callable

from ..errors import ConfigError, RankFailedError
from .blame import RankFailure, death, failure_report
from .hard_exit import hard_exit
from .ports import free_port
from .watch import HeartbeatWatch, RankLink, heartbeat_timeout

# After the first failure, how long the other ranks get to report their own state
# (they usually fail within a second, once the failed rank has left their collectives).
_GRACE_AFTER_FAILURE_S = 2.0
_STOP_GRACE_S = 3.0

# On a line of its own: an interrupted rank's progress bar may have left its line open on the shared stderr.
INTERRUPTED = "\nmeshdit: interrupted; all ranks stopped"


def under_torchrun() -> bool:
    """True when torchrun (or another launcher) has set up this process as one rank."""
    return "TORCHELASTIC_RUN_ID" in os.environ or all(k in os.environ for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK"))


def check_torchrun_world(world_size: int) -> None:
    """Under torchrun, the world torchrun made must have the degrees' product of ranks."""
    if under_torchrun() and int(os.environ["WORLD_SIZE"]) != world_size:
        raise ConfigError(
            f"torchrun started {os.environ['WORLD_SIZE']} ranks but the degrees multiply to {world_size}: change "
            f"--nproc-per-node/--nnodes so that they give {world_size} ranks, or change the degrees.")


def launch(entry: Callable[[Any], None], payload: Any, world_size: int) -> None:
    """Runs entry(payload) on `world_size` ranks and returns when every rank has finished.

    Under torchrun this process is one of the ranks, and the world must already
    have `world_size` ranks (its MASTER_ADDR/MASTER_PORT are used). Otherwise ranks are
    spawned here on a free loopback port (one process in-place when world_size is 1).
    Raises RankFailedError naming the first failing rank; KeyboardInterrupt on Ctrl-C or SIGTERM.
    """
    check_torchrun_world(world_size)
    if under_torchrun():
        _run_in_process(entry, payload)
        return
    with _sigterm_as_interrupt():
        if world_size == 1:
            world = dict(RANK="0", WORLD_SIZE="1", LOCAL_RANK="0", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()))
            saved = {k: os.environ.get(k) for k in world}
            os.environ.update(world)
            try:
                with _exit_soon_after_interrupt():
                    _run_in_process(entry, payload)
            finally:  # else a later launch in this process would take itself for a torchrun rank
                for key, value in saved.items():
                    if value is None:
                        os.environ.pop(key, None)
                    else:
                        os.environ[key] = value
        else:
            _spawn_and_watch(entry, payload, world_size)


@contextmanager
def _sigterm_as_interrupt():
    """SIGTERM to the launcher stops and cleans up like Ctrl-C (KeyboardInterrupt; exit 130)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def interrupt(signum, frame):
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGTERM, interrupt)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


@contextmanager
def _exit_soon_after_interrupt(grace_s: float = _STOP_GRACE_S):
    """For the one rank run in this process: Ctrl-C or SIGTERM during one long native operation (a huge
    request's attention call) would wait for it to return, since Python handles signals between bytecodes.
    The signal's C handler writes to a wakeup fd at once: a thread reading it ends the process with 130
    if the run has not unwound within grace_s."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    read_fd, write_fd = os.pipe()
    os.set_blocking(write_fd, False)
    previous = signal.set_wakeup_fd(write_fd, warn_on_full_buffer=False)
    unwound = threading.Event()

    def watch() -> None:
        while not unwound.is_set():
            try:
                data = os.read(read_fd, 64)
            except OSError:
                return
            if not data:
                return  # closed: the run is over
            if {signal.SIGINT, signal.SIGTERM} & set(data) and not unwound.wait(grace_s):
                print(INTERRUPTED, file=sys.stderr, flush=True)
                hard_exit(130)

    thread = threading.Thread(target=watch, name="meshdit-interrupt-watch", daemon=True)
    thread.start()
    try:
        yield
    finally:
        unwound.set()
        signal.set_wakeup_fd(previous)
        os.close(write_fd)
        thread.join(timeout=1.0)
        os.close(read_fd)


@contextmanager
def _sigint_ignored_by_children():
    """Processes started inside ignore Ctrl-C (an ignored signal stays ignored across exec): the terminal
    sends SIGINT to the whole group, and a rank interrupted on its own, mid-import or mid-collective,
    prints tracebacks; the launcher alone takes Ctrl-C and stops the ranks with SIGTERM (`_stop`)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)


def _summary(exc: BaseException) -> str:
    """'ConfigError: first line of the message'."""
    lines = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {lines[0]}" if lines else type(exc).__name__


def _traceback(exc: BaseException) -> str:
    """This exception's own traceback: one, even when it was raised from another (its message says why); none for
    an error whose message says all a user can act on (`says_it_all`: a full disk, a NaN image)."""
    if getattr(exc, "says_it_all", False):
        return ""
    return "".join(traceback.format_exception(type(exc), exc, exc.__traceback__, chain=False)).rstrip()


def _run_in_process(entry: Callable[[Any], None], payload: Any) -> None:
    """entry(payload) as this process's rank: a failure becomes one RankFailedError, printed once."""
    from .mesh import teardown_distributed

    rank = os.environ.get("RANK", "0")
    try:
        entry(payload)
    except (KeyboardInterrupt, SystemExit, RankFailedError):
        raise
    except BaseException as exc:  # noqa: BLE001 - reported once, wrapped, by the cli
        raise RankFailedError(f"rank {rank} failed: {_summary(exc)}\n{_traceback(exc)}".rstrip()) from None
    finally:
        teardown_distributed()
        sys.stdout.flush()
        sys.stderr.flush()


def _spawn_and_watch(entry: Callable[[Any], None], payload: Any, world_size: int) -> None:
    ctx = multiprocessing.get_context("spawn")
    job = pickle.dumps((entry, payload))
    port = free_port()  # ours alone: an exported MASTER_PORT would let two runs join each other's world
    timeout = heartbeat_timeout()
    procs, conns = [], []
    try:
        for rank in range(world_size):
            parent, child = ctx.Pipe(duplex=False)
            proc = ctx.Process(target=_rank_main, args=(rank, world_size, port, child, job, timeout),
                               name=f"meshdit-rank{rank}", daemon=True)
            with _sigint_ignored_by_children():
                proc.start()
            child.close()
            procs.append(proc)
            conns.append(parent)
        _watch(procs, conns, timeout)
    finally:
        _stop(procs)
        for conn in conns:
            conn.close()


def _watch(procs: list, conns: list, timeout: float) -> None:
    """Returns when every rank has finished; raises RankFailedError on the first failure or freeze."""
    world = len(procs)
    watch = HeartbeatWatch(world, timeout)
    done: set[int] = set()
    failed: dict[int, RankFailure] = {}
    open_conns = dict(enumerate(conns))
    first_failure_at = None
    while True:
        ready = multiprocessing.connection.wait(list(open_conns.values()), timeout=0.2)
        for rank, conn in list(open_conns.items()):
            if conn not in ready:
                continue
            try:
                while conn.poll():
                    message = conn.recv()
                    watch.beat(rank, joined=message[0] == "joined")
                    if message[0] == "done":
                        done.add(rank)
                    elif message[0] == "error":
                        failed[rank] = RankFailure(*message[1:])
            except (EOFError, OSError):
                del open_conns[rank]
        for rank, proc in enumerate(procs):  # died without a word: killed, or crashed in C++
            if proc.exitcode not in (None, 0) and rank not in failed and rank not in open_conns:
                failed[rank] = death(time.time(), proc.exitcode)
        if len(done) == world and all(p.exitcode is not None or not p.is_alive() for p in procs):
            return
        if failed and first_failure_at is None:
            first_failure_at = time.monotonic()
        if first_failure_at is not None:
            settled = all(r in failed or r in done for r in range(world))
            if settled or time.monotonic() - first_failure_at > _GRACE_AFTER_FAILURE_S:
                raise RankFailedError(failure_report(failed, done, world))
            continue
        frozen = watch.silent(r for r in range(world) if r not in done)
        if frozen:
            rank, silent_s = frozen[0]
            names = ", ".join(f"rank {r}" for r, _ in frozen)
            raise RankFailedError(
                f"rank {rank} stopped responding: no heartbeat for {silent_s:.0f} s (frozen, stopped with SIGSTOP, "
                f"or starved of CPU; limit MESHDIT_HEARTBEAT_TIMEOUT={timeout:g} s). Silent: {names}; "
                "every rank was stopped.")


def _stop(procs: list) -> None:
    """Ends every rank still running: SIGTERM (and SIGCONT, for a stopped one), then SIGKILL."""
    alive = [p for p in procs if p.is_alive()]
    for proc in alive:
        try:
            proc.terminate()
            os.kill(proc.pid, signal.SIGCONT)
        except (ProcessLookupError, OSError):
            pass
    deadline = time.monotonic() + _STOP_GRACE_S
    for proc in alive:
        proc.join(timeout=max(0.0, deadline - time.monotonic()))
        if proc.is_alive():
            proc.kill()
            proc.join(timeout=5)


def _rank_main(rank: int, world_size: int, port: int, conn, job: bytes, timeout: float) -> None:
    """A spawned rank: heartbeat first, then the job; reports 'done' or its error to the launcher."""
    link = RankLink(conn, timeout)
    link.start_heartbeat()

    def interrupt(signum, frame):  # the launcher's SIGTERM: unwind (temp files removed), then exit
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, interrupt)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the launcher's (it sends SIGTERM)
    os.environ.update(RANK=str(rank), WORLD_SIZE=str(world_size), LOCAL_RANK=str(rank),
                      MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    code = 0
    try:
        _thread_lock_for_tqdm()
        entry, payload = pickle.loads(job)
        entry(payload)
    except KeyboardInterrupt:
        code = 130
    except BaseException as exc:  # noqa: BLE001 - reported to the launcher, which prints it once
        signal.signal(signal.SIGTERM, signal.SIG_DFL)  # being stopped now needs no unwinding
        # Stamped before teardown: leaving the world is what makes the other ranks fail after it.
        link.send(("error", time.time(), _summary(exc), _traceback(exc)))
        code = 1
    else:
        link.send(("done",))
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        link.stop_heartbeat()
        _leave_world()
        sys.stdout.flush()
        sys.stderr.flush()
    hard_exit(code)  # gloo may abort in interpreter teardown; everything is flushed


def _leave_world() -> None:
    """Destroys the process group if this rank joined one. Never imports: a rank stopped while importing
    torch has a half-initialised torch in sys.modules, and importing it again raises."""
    dist = sys.modules.get("torch.distributed")
    try:
        if dist is not None and dist.is_available() and dist.is_initialized():
            dist.destroy_process_group()
    except Exception:  # noqa: BLE001 - leaving anyway; the launcher has the rank's own report
        pass


def _thread_lock_for_tqdm() -> None:
    """tqdm's default lock includes a multiprocessing lock: a semaphore that a killed rank leaks
    ("leaked semaphore objects" warning). Ranks draw bars from one thread: a thread lock suffices."""
    try:
        from tqdm import tqdm
    except ImportError:
        return
    tqdm.set_lock(threading.RLock())
