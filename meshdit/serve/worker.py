"""What every rank of `meshdit serve` runs: load once, then run the output rank's requests in its order.

The output rank (global rank 0) serves HTTP from a uvicorn thread; its main thread
broadcasts each batch (or a heartbeat when idle, so no rank's collective times out)
to every rank, and all ranks run it together.
"""
from __future__ import annotations

import os
import signal
import threading
import time
import traceback

import torch.distributed as dist

from ..distributed.hard_exit import hard_exit
from ..errors import ConfigError
from .server_state import ServerState, ServeSettings

HEARTBEAT_S = 1.0  # idle ranks hear from the output rank this often
DEAD_GRACE_S = 3.0  # after a rank failure, answer 503 this long, then exit non-zero


def run_serve(settings: ServeSettings) -> None:
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

    engine = start_rank(settings.engine, on_mesh).engine
    state, server = http.get("state"), http.get("server")
    engine.pipe.set_progress_bar_config(disable=True)
    dist.barrier()  # loaded on every rank
    if state is None:
        _follow(engine)
        return
    state.attach(engine)
    print(f"meshdit: serving {state.model_id} on http://{settings.host}:{settings.port} (layout {state.layout} on "
          f"{dist.get_world_size()} rank(s); {'API key required' if settings.api_key else 'no API key'})",
          flush=True)
    running: list = []
    try:
        _lead(engine, state, stop, running)
    except BaseException as exc:  # a rank died or left a collective: say so over HTTP, then exit non-zero
        state.mark_dead(f"{type(exc).__name__}: {exc}".splitlines()[0][:300], running)
        traceback.print_exc()
        print(f"meshdit: error: the mesh failed ({state.dead}); answering 503 for {DEAD_GRACE_S:g} s, then "
              "exiting (no restart: start `meshdit serve` again)", flush=True)
        time.sleep(DEAD_GRACE_S)
        stop_http(server)
        hard_exit(1)  # gloo teardown with a dead peer can hang; nothing is left to flush
    stop_http(server)
    print("meshdit: drained and stopped every rank", flush=True)


def _lead(engine, state: ServerState, stop: threading.Event, running: list) -> None:
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
            _run(engine, message[1], state, batch)
            running.clear()


def _follow(engine) -> None:
    while True:
        box = [None]
        dist.broadcast_object_list(box, src=0)
        if box[0][0] == "stop":
            return
        if box[0][0] == "run":
            _run(engine, box[0][1], None, None)


def _run(engine, requests, state: ServerState | None, batch) -> None:
    """One batch on this rank. Outcomes that every rank reaches alike (cancel, refused request) are not faults."""
    from ..denoising.loop import GenerationCancelled

    on_step = state.progress(batch) if state is not None else (lambda step, total: False)
    try:
        results = engine.generate_many(requests, on_step=on_step)
    except GenerationCancelled as exc:
        if state is not None:
            state.stopped(batch, exc.step)
        return
    except ConfigError as exc:
        if state is not None:
            state.fail(batch, str(exc), 400)
        return
    from ..output import non_finite_note

    note = non_finite_note([r.images for r in results])  # every rank holds the gathered images: all agree
    if note is not None:  # a blank PNG is no answer
        if state is not None:
            state.fail(batch, f"{note}; no image was made", 500)
        return
    if state is not None:
        state.finish(batch, results)


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
