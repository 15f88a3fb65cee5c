"""What every rank of `meshdit serve` runs: load once, then run the output rank's requests in its order.

The output rank (global rank 0) serves HTTP from a uvicorn thread; its main thread
broadcasts each batch (or a heartbeat when idle, so no rank's collective times out)
to every rank, and all ranks run it together.

A request that raises fails alone when every rank raised: at each batch's end the ranks agree on its outcome (a
failure flag all-reduced over a gloo group of their own, then, on failure, every rank's error gathered), so a
model's error on one input is that job's 4xx/5xx and the mesh serves on. Ranks that disagree (one raised, the
others did not), a rank that died, or a collective that failed end the mesh: 503 naming the rank to blame
(distributed/blame.py), then exit.
"""
from __future__ import annotations

import logging
import os
import signal
import threading
import time
import traceback
import warnings

import torch
import torch.distributed as dist

from ..distributed.blame import RankFailure
from ..distributed.hard_exit import hard_exit
from ..errors import ConfigError
from .server_state import ServerState, ServeSettings

HEARTBEAT_S = 1.0  # idle ranks hear from the output rank this often
DEAD_GRACE_S = 3.0  # after a rank failure, answer 503 this long, then exit non-zero
REPORT_WAIT_S = 5.0  # after a broken connection or a timeout, how long rank 0 waits for the launcher to say which rank died
log = logging.getLogger("meshdit.serve")


class MeshDiverged(RuntimeError):
    """Some ranks raised in a request and others did not: their states differ, the mesh cannot go on."""


class FailedAlone(RuntimeError):
    """This rank raised in a request, and the others never came to agree on it (they wait in the request's
    collectives, or left): the mesh ends. Its message is the request's error, for the launcher's report."""


def run_serve(settings: ServeSettings, reports=None) -> None:
    """reports: the launcher's queue of (rank, RankFailure): ranks that raised or died (spawned ranks only)."""
    from ..rank import start_rank

    stop = threading.Event()
    http: dict = {}  # the output rank's ServerState and uvicorn server, started before the weights load

    def on_mesh(mesh) -> None:
        if mesh.is_output_rank:
            http["state"] = ServerState(settings)
            http["server"] = start_http(http["state"])

            def on_signal(signum, frame):  # drain: the running batch finishes, then every rank stops
                stop.set()
                http["state"].begin_drain()  # at once, not after the running batch: new jobs get 503 from now on

            signal.signal(signal.SIGTERM, on_signal)
            signal.signal(signal.SIGINT, on_signal)
        else:  # the output rank decides when to stop and tells the others; the launcher kills leftovers
            signal.signal(signal.SIGTERM, signal.SIG_IGN)
            signal.signal(signal.SIGINT, signal.SIG_IGN)

    log_warnings_as_lines()
    engine = start_rank(settings.engine, on_mesh).engine
    state, server = http.get("state"), http.get("server")
    engine.pipe.set_progress_bar_config(disable=True)
    outcome = Outcome()  # every rank, in the same order: a collective
    dist.barrier()  # loaded on every rank
    if state is None:
        _follow(engine, outcome)
        return
    state.attach(engine)
    print(f"meshdit: serving {state.model_id} on http://{settings.host}:{settings.port} (layout {state.layout} on "
          f"{dist.get_world_size()} rank(s); {'API key required' if settings.api_key else 'no API key'})",
          flush=True)
    running: list = []
    try:
        _lead(engine, state, stop, running, outcome)
    except BaseException as exc:  # a rank died or left a collective: say so over HTTP, then exit non-zero
        state.mark_dead(_blame(exc, reports)[:300], running)
        traceback.print_exc()
        print(f"meshdit: error: the mesh failed ({state.dead}); answering 503 for {DEAD_GRACE_S:g} s, then "
              "exiting (no restart: start `meshdit serve` again)", flush=True)
        time.sleep(DEAD_GRACE_S)
        stop_http(server)
        hard_exit(1)  # gloo teardown with a dead peer can hang; nothing is left to flush
    stop_http(server)
    print("meshdit: drained and stopped every rank", flush=True)


def _lead(engine, state: ServerState, stop: threading.Event, running: list, outcome: "Outcome") -> None:
    parent = os.getppid()
    while True:
        if stop.is_set() or (state.settings.spawned and os.getppid() != parent):
            state.drain()
        if state.draining and not state.may_stop():  # results that finished during the drain are being fetched
            time.sleep(0.1)
            message = ("idle",)
        elif state.draining:
            message = ("stop",)
        else:
            state.expire_waiting()
            state.results.expire()
            batch = state.queue.next_batch(timeout=HEARTBEAT_S)
            message = ("run", [job.request for job in batch]) if batch else ("idle",)
        dist.broadcast_object_list([message], src=0)
        if message[0] == "stop":
            return
        if message[0] == "run":
            running[:] = batch
            state.metrics.batch_images.observe(sum(job.num_images for job in batch))
            _run(engine, message[1], state, batch, outcome)
            running.clear()


def _follow(engine, outcome: "Outcome") -> None:
    while True:
        box = [None]
        dist.broadcast_object_list(box, src=0)
        if box[0][0] == "stop":
            return
        if box[0][0] == "run":
            _run(engine, box[0][1], None, None, outcome)


def _run(engine, requests, state: ServerState | None, batch, outcome: "Outcome") -> None:
    """One batch on this rank. Outcomes that every rank reaches alike (cancel, a refused request, an error every
    rank raised) end the batch's jobs, not the mesh."""
    from ..denoising.loop import GenerationCancelled

    on_step = state.progress(batch) if state is not None else (lambda step, total: False)
    results = cancelled = failure = None
    try:
        results = engine.generate_many(requests, on_step=on_step)
    except GenerationCancelled as exc:  # agreed: every rank stops at the same step
        cancelled = exc.step
    except ConfigError as exc:
        failure = (400, str(exc), "")
    except Exception as exc:  # noqa: BLE001 - agreed just below: this job's failure, or a diverged mesh
        failure = (500, f"{type(exc).__name__}: {exc}", traceback.format_exc())
    try:
        failures = outcome.agree(failure)  # {rank: failure} of every rank that raised
    except Exception as exc:  # noqa: BLE001 - the others never came (they wait in the request's collectives)
        if failure is None:
            raise
        raise FailedAlone(failure[1].splitlines()[0]) from exc
    if failures and len(failures) < dist.get_world_size():
        rank, (_, message, _) = next(iter(failures.items()))
        raise MeshDiverged(f"rank {rank} failed a request that rank(s) "
                           f"{', '.join(str(r) for r in outcome.ranks if r not in failures)} finished: {message}")
    if state is None:
        return
    if failures:
        status, message, trace = failures[0]
        if trace:  # not a refusal: the log gets what went wrong, the client its first line
            print(trace.rstrip(), flush=True)
            log.error("the request failed on every rank (the server keeps serving): %s", message.splitlines()[0])
        state.fail(batch, message if status == 400 else
                   f"the model failed on this request: {message.splitlines()[0][:500]}", status)
        return
    if cancelled is not None:
        state.stopped(batch, cancelled)
        return
    from ..output import non_finite_note

    note = non_finite_note([r.images for r in results])  # only the output rank reads it: no rank must agree
    if note is not None:  # a blank PNG is no answer
        state.fail(batch, f"{note}; no image was made", 500)
    else:
        state.finish(batch, results)


class Outcome:
    """How the ranks agree on each batch's outcome, over a gloo group of their own: a rank that raised before a
    collective the others wait in meets them nowhere (they time out, the mesh ends) rather than in another
    collective of the same group."""

    def __init__(self) -> None:
        from ..distributed.mesh import DEFAULT_TIMEOUT

        self.group = dist.new_group(backend="gloo", timeout=DEFAULT_TIMEOUT)
        self.ranks = range(dist.get_world_size())

    def agree(self, failure: tuple | None) -> dict[int, tuple]:
        """failure: this rank's (status, message, traceback), or None -> every failed rank's, by rank."""
        flag = torch.tensor([0 if failure is None else 1])
        dist.all_reduce(flag, group=self.group)
        if not flag.item():
            return {}
        everyone = [None] * len(self.ranks)
        dist.all_gather_object(everyone, failure, group=self.group)
        return {rank: f for rank, f in enumerate(everyone) if f is not None}


def _blame(exc: BaseException, reports) -> str:
    """What the 503 says: blame.py's cause among this rank's error and what the launcher reports (a rank's own
    error, else a rank that died, before the broken connection this rank then saw)."""
    if isinstance(exc, MeshDiverged):
        return f"the ranks diverged: {exc}"
    failed = {0: RankFailure(time.time(), f"{type(exc).__name__}: {exc}".splitlines()[0], traceback.format_exc())}
    deadline = time.monotonic() + REPORT_WAIT_S
    while reports is not None and all(map(_consequence, failed.values())) and time.monotonic() < deadline:
        if reports.empty():
            time.sleep(0.05)
            continue
        rank, failure = reports.get()
        failed.setdefault(rank, failure)
    cause = min(failed, key=lambda r: (_consequence(failed[r]), failed[r].weight()))
    first = failed[cause]
    return f"rank {cause} {first.line}" if first.died else f"rank {cause} failed: {first.line}"


def _consequence(failure: RankFailure) -> bool:
    """A broken connection, or a collective that timed out: what a rank sees of another's failure."""
    return failure.broken_connection or "timed out" in failure.line.lower()


def log_warnings_as_lines() -> None:
    """Python warnings (an unknown prompt word, a library's deprecation) as one line each through the server's
    logger, not warnings' two-line file:line + source form."""
    if not log.handlers:
        handler = logging.StreamHandler()
        handler.setFormatter(logging.Formatter(f"meshdit serve (rank {os.environ.get('RANK', '0')}): "
                                               "%(levelname)s: %(message)s"))
        log.addHandler(handler)
        log.propagate = False

    def one_line(message, category, filename, lineno, file=None, line=None):
        text = " ".join(str(message).split())
        log.warning("%s: %s (%s:%s)", category.__name__, text, os.path.basename(filename), lineno)

    warnings.showwarning = one_line


def start_http(state: ServerState):
    """uvicorn in a daemon thread (the main thread runs the rank loop); fails fast if the port is taken."""
    import uvicorn

    from .app import create_app

    config = uvicorn.Config(create_app(state), host=state.settings.host, port=state.settings.port,
                            log_level="warning", access_log=False, lifespan="off",
                            timeout_graceful_shutdown=5)
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, name="meshdit-http", daemon=True)
    thread.start()
    server.thread = thread
    deadline = time.monotonic() + 30
    while not server.started and thread.is_alive() and time.monotonic() < deadline:
        time.sleep(0.05)
    if not server.started:
        raise RuntimeError(f"could not serve on {state.settings.host}:{state.settings.port}")
    return server


def stop_http(server) -> None:
    """Lets answers in flight (e.g. the drained job's) reach their clients, then stops serving."""
    server.should_exit = True
    server.thread.join(timeout=10)
