"""Finished jobs' PNGs on the output rank, bounded by bytes and by age (--result-store-mb, --result-ttl).

The oldest results expire first. An expired job keeps its record: its status says "expired" and why, and
its content answers 410 Gone. A synchronous request's result is pinned while its request waits for it
and released once answered (nobody else knows that job's id).
"""
from __future__ import annotations

import threading
import time
from collections import OrderedDict

from .jobs import Job


class ResultStore:
    def __init__(self, max_bytes: int, ttl: float, metrics) -> None:
        self.max_bytes, self.ttl, self.metrics = max_bytes, ttl, metrics
        self._jobs: OrderedDict[str, Job] = OrderedDict()  # in the order they finished, oldest first
        self.bytes = 0
        self._lock = threading.Lock()

    def add(self, job: Job) -> None:
        """A job is done and holds its PNGs; older results expire if the store is now over its bounds."""
        with self._lock:
            if not job.pngs or job.discard:  # released already, or deleted by its client
                return
            self._jobs[job.id] = job
            self.bytes += sum(len(png) for png in job.pngs)
            self._expire(time.time())

    def held(self) -> list[Job]:
        with self._lock:
            return list(self._jobs.values())

    def release(self, job: Job) -> None:
        """The synchronous answer went out (or its client left): the PNGs are dropped, the job stays done."""
        with self._lock:
            job.pinned = False
            if self._jobs.pop(job.id, None) is not None:
                self.bytes -= sum(len(png) for png in job.pngs)
                self._publish()
            job.pngs = []  # also when the answer went out before add(): add() then skips it

    def expire(self) -> None:
        """Results older than the age bound expire (called by the rank loop while idle and on each lookup)."""
        with self._lock:
            self._expire(time.time())

    def _expire(self, now: float) -> None:
        for job in list(self._jobs.values()):  # oldest first
            if job.pinned:
                continue
            if now - job.finished > self.ttl:
                self._drop(job, "age", f"the result of job {job.id} expired: this server keeps results "
                                       f"{self.ttl:g} s after a job ends (--result-ttl)")
            elif self.bytes > self.max_bytes:
                self._drop(job, "bytes", f"the result of job {job.id} expired: newer results pushed it out of "
                                         f"this server's {self.max_bytes >> 20} MiB result store (--result-store-mb); "
                                         "fetch results sooner")
        self._publish()

    def _drop(self, job: Job, reason: str, message: str) -> None:
        del self._jobs[job.id]
        self.bytes -= sum(len(png) for png in job.pngs)
        job.error, job.http_status = message, 410
        job.state = "expired"  # before the PNGs go: a reader that finds none finds this state too
        job.pngs = []  # a new list, not clear(): a request holding the old one still answers with it
        self.metrics.results_expired.labels(reason).inc()

    def _publish(self) -> None:
        self.metrics.result_store_bytes.set(self.bytes)
        self.metrics.result_store_jobs.set(len(self._jobs))
