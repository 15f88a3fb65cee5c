"""Replicas of `meshdit serve` on Ray Serve: `meshdit serve --ray --replicas N` (docs/serving.md, "Replicas on Ray
Serve"), or `serve run meshdit.serve.ray_app:app_builder flags="..."` with Ray's own config files.

Each Serve replica is one mesh. The replica's process is rank 0: it answers HTTP through the same FastAPI app as
`meshdit serve` (serve/app.py) and runs the same rank loop (worker._lead); ranks 1..N-1 are Ray actors in the
replica's placement group (STRICT_PACK: one node; GPUs assigned by Ray), running worker._follow. Async jobs are
published to a named `JobBoard` actor, so a job's GET, content and DELETE (images and videos) work whichever
replica answers. A replica
whose rank dies fails its running and waiting jobs with a status naming the rank, then fails Serve's health
check, so Ray replaces it; the other replicas' jobs are untouched.
"""
from __future__ import annotations

import dataclasses
import os
import threading
import time

import ray
from ray import serve
from ray.util.placement_group import get_current_placement_group
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

from ..distributed.ports import free_port
from .jobs import TERMINAL, Job, JobQueue
from .server_state import ServerState, ServeSettings

NAMESPACE = "meshdit"
BOARD_JOBS = 1000  # jobs the board remembers; the oldest finished ones are forgotten first
LOAD_TIMEOUT_S = 1800.0  # a replica whose mesh has not loaded by then fails to start
REPLICA_HEADER = "x-meshdit-replica"  # which replica answered (a job's GET may come from any)


@ray.remote(num_cpus=0)
class JobBoard:
    """Every replica's async jobs (images and videos) as copies taken at each change, with their results once done,
    and the DELETEs other replicas received, for the jobs' owners to carry out."""

    def __init__(self) -> None:
        self.jobs: dict[str, Job] = {}  # id -> the owner's latest copy
        self.requests: dict[str, str] = {}  # id -> "cancel" or "forget" (a DELETE of a video)

    def publish(self, copy: Job) -> None:
        if copy.id in self.requests and self.requests[copy.id] == "forget":
            return  # deleted: its id answers 404 everywhere from now on
        self.jobs.pop(copy.id, None)  # re-inserted: the newest last
        self.jobs[copy.id] = copy
        finished = [i for i, job in self.jobs.items() if job.state in TERMINAL]
        for old in finished[:max(0, len(self.jobs) - BOARD_JOBS)]:
            del self.jobs[old]
            self.requests.pop(old, None)

    def get(self, job_id: str) -> Job | None:
        return self.jobs.get(job_id)

    def ask(self, job_id: str, what: str) -> None:
        """what: "cancel" (DELETE of an image job: it stops) or "forget" (of a video: it stops and is dropped)."""
        self.requests[job_id] = what
        if what == "forget":
            self.jobs.pop(job_id, None)

    def asked(self, job_ids: list[str]) -> dict[str, str]:
        return {i: self.requests[i] for i in job_ids if i in self.requests}


def board_copy(job: Job) -> Job:
    """What the board keeps of a job: everything but its threading event (results included once done)."""
    return dataclasses.replace(job, done=None, fetched=set())


class BoardQueue(JobQueue):
    """The replica's queue, telling the board each job's state as it changes; DELETEs sent to other replicas
    reach a waiting job here, when the rank loop next looks for a batch."""

    def __init__(self, settings: ServeSettings, publish, board) -> None:
        super().__init__(settings.max_queue, settings.batching, settings.max_batch_images)
        self._publish, self._board = publish, board

    def submit(self, job: Job) -> None:
        super().submit(job)
        self._publish(job)

    def carry_out(self, jobs: list[Job]) -> None:
        """The DELETEs other replicas took for these jobs of this replica."""
        asked = ray.get(self._board.asked.remote([job.id for job in jobs])) if jobs else {}
        for job in jobs:
            if asked.get(job.id) == "forget":
                self.forget(job)
            elif asked.get(job.id) == "cancel":
                self.cancel(job)

    def next_batch(self, timeout: float) -> list[Job]:
        with self._lock:
            waiting = list(self._waiting)
        self.carry_out(waiting)
        batch = super().next_batch(timeout)
        for job in batch:
            self._publish(job)
        return batch

    def cancel(self, job: Job) -> None:
        if self.get(job.id) is job:
            super().cancel(job)
        else:  # another replica's: its owner stops it at its next step (or before it starts)
            self._board.ask.remote(job.id, "cancel")

    def forget(self, job: Job) -> None:
        if self.get(job.id) is job:
            super().forget(job)
        else:
            self._board.ask.remote(job.id, "forget")

    def end(self, job: Job, state: str, error: str | None = None, http_status: int = 200) -> None:
        super().end(job, state, error, http_status)
        self._publish(job)


class BoardState(ServerState):
    """ServerState whose jobs are on the board too (serve/app.py and serve/videos.py ask `remote_job` for ids this
    replica does not hold)."""

    def __init__(self, settings: ServeSettings, board, replica: str) -> None:
        super().__init__(settings)
        self.board, self.replica = board, replica
        self.queue = BoardQueue(settings, self.publish, board)

    def publish(self, job: Job) -> None:
        self.board.publish.remote(board_copy(job))

    def remote_job(self, job_id: str) -> Job | None:
        return ray.get(self.board.get.remote(job_id))

    def answers_when_dead(self, method: str, path: str) -> bool:
        """Until Ray replaces this replica, jobs' status and results still come from the board (new work: 503)."""
        return method in ("GET", "DELETE") and path.startswith(("/v1/images/jobs/", "/v1/videos/"))

    def progress(self, batch: list[Job]):
        on_step = super().progress(batch)

        def on_step_published(step: int, total: int) -> bool:
            self.queue.carry_out([job for job in batch if job.state == "running"])
            stop = on_step(step, total)
            for job in batch:
                if job.state == "running":
                    self.publish(job)
            return stop

        return on_step_published


@ray.remote
class RankActor:
    """Ranks 1..N-1 of one replica's mesh: load, then follow rank 0's batches until it says stop."""

    def run(self, settings: ServeSettings, rank: int, world_size: int, address: str, port: int) -> None:
        os.environ.update(RANK=str(rank), WORLD_SIZE=str(world_size), LOCAL_RANK=str(rank), MASTER_ADDR=address,
                          MASTER_PORT=str(port))
        import torch.distributed as dist

        from ..rank import start_rank
        from .worker import Outcome
        from .worker import _follow as follow  # the same loop as `meshdit serve`'s ranks

        engine = start_rank(settings.engine).engine
        engine.pipe.set_progress_bar_config(disable=True)
        outcome = Outcome()  # every rank, in the same order: a collective
        dist.barrier()  # loaded on every rank
        follow(engine, outcome)


class MeshReplica:
    """One Serve replica: rank 0 of its mesh, the FastAPI app of `meshdit serve` as its ingress."""

    def __init__(self, settings: ServeSettings, board_name: str, gpus_per_rank: float, cpus_per_rank: float) -> None:
        settings = dataclasses.replace(settings, spawned=False)
        self.replica = serve.get_replica_context().replica_id.unique_id
        board = ray.get_actor(board_name, namespace=NAMESPACE)
        self.state = BoardState(settings, board, self.replica)
        self.stop = threading.Event()
        world_size = settings.config.world_size
        address, port = ray.util.get_node_ip_address(), free_port()
        group = get_current_placement_group()
        self.ranks = [RankActor.options(
            num_cpus=cpus_per_rank, num_gpus=gpus_per_rank, name=f"meshdit-rank-{self.replica}-{rank}", namespace=NAMESPACE,
            scheduling_strategy=PlacementGroupSchedulingStrategy(placement_group=group,
                                                                 placement_group_bundle_index=rank),
        ).remote() for rank in range(1, world_size)]
        self.runs = [actor.run.remote(settings, rank, world_size, address, port)
                     for rank, actor in enumerate(self.ranks, start=1)]
        os.environ.update(RANK="0", WORLD_SIZE=str(world_size), LOCAL_RANK="0", MASTER_ADDR=address,
                          MASTER_PORT=str(port))
        self.loaded = threading.Event()
        self.thread = threading.Thread(target=self._lead, name="meshdit-rank-loop", daemon=True)
        self.thread.start()
        deadline = time.monotonic() + LOAD_TIMEOUT_S
        while not self.loaded.wait(0.5):  # Serve routes to this replica once __init__ returns
            if self.state.dead or self._ended_rank() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"meshdit replica {self.replica} did not start: "
                                   f"{self.state.dead or self._blame() or 'its mesh did not load in time'}")

    def __serve_build_asgi_app__(self):
        from .app import create_app

        return ReplicaHeader(create_app(self.state), self.replica)

    def check_health(self) -> None:
        """Serve's health check: a replica whose mesh failed is replaced."""
        if self.state.dead:
            raise RuntimeError(f"meshdit replica {self.replica}: {self.state.dead}")

    def __del__(self) -> None:
        self.stop.set()

    def _lead(self) -> None:
        import torch.distributed as dist

        from ..rank import start_rank
        from .worker import Outcome
        from .worker import _lead as lead  # the same loop as `meshdit serve`'s output rank

        running: list = []
        try:
            engine = start_rank(self.state.settings.engine).engine
            engine.pipe.set_progress_bar_config(disable=True)
            outcome = Outcome()
            dist.barrier()
            self.state.attach(engine)
            self.loaded.set()
            lead(engine, self.state, self.stop, running, outcome)
        except BaseException as exc:  # noqa: BLE001 - a rank died or left a collective: fail its jobs, say which
            self.state.mark_dead(self._blame() or f"{type(exc).__name__}: {exc}".splitlines()[0][:300], running)

    def _ended_rank(self) -> int | None:
        done, _ = ray.wait(self.runs, num_returns=1, timeout=0) if self.runs else ([], [])
        return self.runs.index(done[0]) + 1 if done else None

    def _blame(self) -> str | None:
        """Which rank actor ended, and why (a rank's run never returns while the mesh serves)."""
        deadline = time.monotonic() + 5  # the dead actor's error reaches Ray a moment after the peers' gloo errors
        while (rank := self._ended_rank()) is None and time.monotonic() < deadline:
            time.sleep(0.1)
        if rank is None:
            return None
        try:
            ray.get(self.runs[rank - 1])
            why = "it stopped"
        except Exception as exc:  # noqa: BLE001 - RayActorError (killed, crashed) or the rank's own error
            why = str(exc).strip().splitlines()[0][:300]
        return f"rank {rank} of replica {self.replica} (a Ray actor) ended: {why}"


class ReplicaHeader:
    """ASGI wrapper: every answer says which replica gave it (x-meshdit-replica)."""

    def __init__(self, app, replica: str) -> None:
        self.app, self.value = app, replica.encode()

    async def __call__(self, scope, receive, send):
        async def send_with_header(message):
            if message["type"] == "http.response.start":
                message = dict(message, headers=[*message.get("headers", []), (REPLICA_HEADER.encode(), self.value)])
            await send(message)

        await self.app(scope, receive, send_with_header if scope["type"] == "http" else send)


def deployment(settings: ServeSettings, replicas: int = 1, autoscaling: dict | None = None,
               gpus_per_rank: float = 0.0, cpus_per_rank: float = 1.0, board_name: str = "meshdit-jobs",
               name: str = "meshdit"):
    """The bound Serve application: N replicas (or Ray's autoscaling config), each a placement group of one
    bundle per rank packed on one node."""
    board = JobBoard.options(name=board_name, namespace=NAMESPACE, get_if_exists=True, lifetime="detached").remote()
    ray.get(board.get.remote(""))  # it exists before any replica asks for it
    bundle = {"CPU": cpus_per_rank, **({"GPU": gpus_per_rank} if gpus_per_rank else {})}
    options = dict(name=name, placement_group_bundles=[bundle] * settings.config.world_size,
                   placement_group_strategy="STRICT_PACK", ray_actor_options={"num_cpus": cpus_per_rank, "num_gpus": gpus_per_rank},
                   health_check_period_s=2.0, health_check_timeout_s=30.0, max_ongoing_requests=64)
    if autoscaling:
        options["autoscaling_config"] = autoscaling
    else:
        options["num_replicas"] = replicas
    ingress = serve.deployment(**options)(serve.ingress()(MeshReplica))
    return ingress.bind(settings, board_name, gpus_per_rank, cpus_per_rank)


def app_builder(args: dict):
    """`serve run meshdit.serve.ray_app:app_builder flags="--model M --ulysses-degree 2" replicas=2` (or a Serve
    config file's `args`): serve's own flags, checked as `meshdit serve` checks them."""
    import shlex

    from ..flags import FlagParser
    from .command import add_serve_parser, serve_settings

    parser = FlagParser(prog="meshdit")
    add_serve_parser(parser.add_subparsers(dest="command", required=True))
    parsed = parser.parse_args(["serve", *shlex.split(args.get("flags", ""))])
    settings = serve_settings(parsed)
    return deployment(settings, replicas=int(args.get("replicas", 1)), gpus_per_rank=float(args.get("gpus_per_rank", 0)),
                      cpus_per_rank=float(args.get("cpus_per_rank", 1)), board_name=args.get("board", "meshdit-jobs"))


def run_on_ray(settings: ServeSettings, replicas: int, autoscaling: dict | None, address: str | None,
               gpus_per_rank: float | None, cpus_per_rank: float) -> int:
    """`meshdit serve --ray`: deploys the replicas on the Ray cluster at `address` (None: RAY_ADDRESS, else a local
    one), Serve's proxy on --host/--port; runs until Ctrl-C or SIGTERM, then deletes the application."""
    import signal

    ray.init(address=address, namespace=NAMESPACE, include_dashboard=False, log_to_driver=True)
    if gpus_per_rank is None:  # one GPU per rank where the cluster has GPUs
        gpus_per_rank = 1.0 if ray.cluster_resources().get("GPU", 0) > 0 else 0.0
    board_name = f"meshdit-jobs-{settings.port}"
    signal.signal(signal.SIGTERM, lambda signum, frame: (_ for _ in ()).throw(KeyboardInterrupt()))
    try:
        serve.start(http_options={"host": settings.host, "port": settings.port})
        serve.run(deployment(settings, replicas, autoscaling, gpus_per_rank, cpus_per_rank, board_name), name="meshdit",
                  route_prefix="/")
        scale = f"autoscaling {autoscaling}" if autoscaling else f"{replicas} replica(s)"
        print(f"meshdit: serving {settings.model} on Ray Serve, {scale} of layout {settings.config.describe()} on "
              f"http://{settings.host}:{settings.port} (Ctrl-C stops)", flush=True)
        while True:
            time.sleep(1.0)
    except KeyboardInterrupt:
        pass
    finally:
        serve.delete("meshdit")
        try:
            ray.kill(ray.get_actor(board_name, namespace=NAMESPACE))
        except ValueError:
            pass
        serve.shutdown()
        ray.shutdown()
    return 0
