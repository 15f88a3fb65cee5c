"""Jobs and the bounded queue; batches are picked here (same size, steps and guidance, oldest first)."""
from __future__ import annotations

import threading
import time
import uuid
from collections import deque
from dataclasses import dataclass, field

from ..config import GenerateRequest

TERMINAL = ("done", "failed", "cancelled", "expired")  # expired: done, its result dropped (serve/results.py)
_KEEP_FINISHED = 1000  # finished jobs without a stored result remembered for GET; older ones are forgotten


class QueueFull(Exception):
    pass


@dataclass
class Job:
    request: GenerateRequest
    batch_key: tuple  # jobs with equal keys may share a batch
    num_images: int
    steps: int
    id: str = field(default_factory=lambda: "img-" + uuid.uuid4().hex[:16])
    created: float = field(default_factory=time.time)
    state: str = "queued"  # queued -> running -> done (-> expired) | failed | cancelled (public: "cancelling" between)
    step: int = 0
    cached_steps: int | None = None  # with a step cache: steps whose middle blocks were skipped, once done
    error: str | None = None
    http_status: int = 200  # for a failed job: what the synchronous endpoint answers
    pngs: list = field(default_factory=list)  # the encoded results: PNGs, or one MP4 for a video job
    cancel_requested: bool = False
    pinned: bool = False  # a synchronous request waits for the result: it does not expire meanwhile
    fetched: set = field(default_factory=set)  # indexes of the PNGs served (a drain waits for the rest)
    discard: bool = False  # deleted by its client (DELETE /v1/videos/{id}): a result it still makes is not kept
    predicted_s: float | None = None  # the planner's service seconds, uncorrected (serve/admission.py)
    started: float | None = None
    finished: float | None = None
    done: threading.Event = field(default_factory=threading.Event)

    def public(self) -> dict:
        status = "cancelling" if self.state == "running" and self.cancel_requested else self.state  # until it stops
        out = {"id": self.id, "object": "image.job", "status": status, "step": self.step, "steps": self.steps,
               "n": self.num_images, "created": int(self.created)}
        if self.cached_steps is not None:
            out["computed_steps"], out["cached_steps"] = self.steps - self.cached_steps, self.cached_steps
        if self.error:
            out["error"] = self.error
        return out


class JobQueue:
    """Thread-safe: HTTP threads submit and cancel, the rank loop takes batches."""

    def __init__(self, max_queue: int, batching: bool, max_batch_images: int) -> None:
        self.max_queue = max_queue
        self.batching = batching
        self.max_batch_images = max_batch_images
        self._waiting: deque[Job] = deque()
        self.jobs: dict[str, Job] = {}
        self._lock = threading.Condition()

    def __len__(self) -> int:
        return len(self._waiting)

    def submit(self, job: Job) -> None:
        with self._lock:
            if len(self._waiting) >= self.max_queue:
                raise QueueFull()
            self._waiting.append(job)
            self.jobs[job.id] = job
            self._forget_old()
            self._lock.notify_all()

    def get(self, job_id: str) -> Job | None:
        with self._lock:
            return self.jobs.get(job_id)

    def cancel(self, job: Job) -> None:
        """A queued job is dropped now; a running one stops at the next step boundary (rank loop)."""
        with self._lock:
            if job.state == "queued":
                self._waiting.remove(job)
                self.end(job, "cancelled")
            elif job.state == "running":
                job.cancel_requested = True

    def snapshot(self) -> tuple[list[Job], list[Job]]:
        """(waiting jobs, running jobs) as of now."""
        with self._lock:
            return list(self._waiting), [j for j in self.jobs.values() if j.state == "running"]

    def forget(self, job: Job) -> None:
        """The job's id answers 404 from now on (a deleted video); a queued one is cancelled first."""
        with self._lock:  # a Condition's lock is re-entrant: cancel takes it again
            self.cancel(job)
            job.discard = True
            self.jobs.pop(job.id, None)

    def next_batch(self, timeout: float) -> list[Job]:
        """The oldest waiting job plus later ones with the same batch key (when batching), marked running."""
        with self._lock:
            if not self._waiting:
                self._lock.wait(timeout)
            if not self._waiting:
                return []
            batch = [self._waiting.popleft()]
            if self.batching:
                images = batch[0].num_images
                for job in list(self._waiting):
                    if job.batch_key == batch[0].batch_key and images + job.num_images <= self.max_batch_images:
                        self._waiting.remove(job)
                        batch.append(job)
                        images += job.num_images
            for job in batch:
                job.state, job.started = "running", time.time()
            return batch

    def fail_waiting(self, message: str, http_status: int, older_than: float | None = None) -> list[Job]:
        """Fails waiting jobs (all, or those queued before `older_than`); returns them."""
        with self._lock:
            failed = [j for j in self._waiting if older_than is None or j.created < older_than]
            for job in failed:
                self._waiting.remove(job)
                self.end(job, "failed", message, http_status)
            return failed

    def end(self, job: Job, state: str, error: str | None = None, http_status: int = 200) -> None:
        job.state, job.error, job.http_status, job.finished = state, error, http_status, time.time()
        job.done.set()

    def _forget_old(self) -> None:
        finished = [j for j in self.jobs.values() if j.state in TERMINAL and not j.pngs]  # stored: bounded there
        for job in finished[:max(0, len(finished) - _KEEP_FINISHED)]:
            del self.jobs[job.id]
