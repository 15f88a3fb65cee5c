"""Admission by predicted time: each job's service time predicted from the planner's cost model (planner/predict.py
on this server's layout and world), corrected by what this server measured, and `--max-queue-seconds`: a job whose
predicted wait (the work queued and running ahead of it, plus its own) exceeds the limit gets 429 with Retry-After.

The correction is a running mean of measured / predicted over finished batches (the first batch sets it), so a
planner that is off by a constant factor here (an uncalibrated CPU, a busy machine, batching's gain) is right
after one batch. Where the planner cannot price the model (a model folder it cannot read), the prediction is the
mean measured seconds of a job, once one finished.
"""
from __future__ import annotations

import math
import threading
import time

from .jobs import Job

CORRECTION_WEIGHT = 0.3
"""Weight of the newest batch in the running mean of measured / predicted (the first batch: all of it)."""


class Admission:
    def __init__(self, settings, metrics) -> None:
        self.settings, self.metrics = settings, metrics
        self.limit: float | None = settings.max_queue_seconds
        self.correction = 1.0  # measured / predicted, running mean
        self.batches = 0  # finished batches measured
        self.mean_job_s: float | None = None  # measured seconds per job: the prediction without a planner
        self._planner = False  # (layout, costs, world) once started; False: not (yet) priced by the planner
        self._lock = threading.Lock()

    # -- prediction ----------------------------------------------------------
    def start(self) -> None:
        """The model is loaded (ServerState.attach): its folder is local or in the Hub cache, so the planner reads
        its config files and safetensors headers without the network."""
        try:
            self._planner = planner_inputs(self.settings.engine)
        except Exception as exc:  # noqa: BLE001 - advisory: admission falls back to measured times
            print(f"meshdit: the planner cannot price this model ({type(exc).__name__}: {exc}); admission "
                  "predicts from measured times", flush=True)

    def planner_seconds(self, request) -> float | None:
        """The planner's end-to-end seconds for `request` (its defaults filled) on this server, uncorrected."""
        inputs = self._planner
        if not inputs:
            return None
        from ..planner.predict import predict

        layout, costs, world = inputs
        try:
            return predict(layout, costs, world, request).total_s
        except (ArithmeticError, KeyError, TypeError, ValueError):  # advisory: a request the model cannot price
            return None  # is priced at the measured mean of a job

    def price(self, job: Job) -> None:
        """Sets job.predicted_s, the planner's uncorrected seconds (None without a planner)."""
        job.predicted_s = self.planner_seconds(job.request)

    def seconds(self, job: Job) -> float:
        """The job's predicted service seconds, corrected (0 while nothing can predict it)."""
        if job.predicted_s is None:
            return self.mean_job_s or 0.0
        return job.predicted_s * self.correction

    def wait_ahead(self, queue) -> float:
        """Predicted seconds until a job submitted now starts: the waiting jobs' work and the running batch's rest."""
        waiting, running = queue.snapshot()
        now = time.time()
        started = min((job.started for job in running), default=now)
        rest = max(0.0, sum(self.seconds(job) for job in running) - (now - started))
        return rest + sum(self.seconds(job) for job in waiting)

    def refusal(self, queue, job: Job) -> tuple[float, int] | None:
        """(predicted wait, Retry-After seconds) when `job` would wait past --max-queue-seconds, else None. A job
        predicted to take longer than the limit by itself runs when nothing is ahead of it (retrying could never
        make it fit)."""
        if self.limit is None:
            return None
        ahead, own = self.wait_ahead(queue), self.seconds(job)
        if ahead + own <= self.limit or ahead == 0:
            return None
        return ahead + own, max(1, math.ceil(ahead + own - self.limit))

    # -- measurement ---------------------------------------------------------
    def observe(self, batch: list[Job]) -> None:
        """A batch finished: its measured seconds (start to end) against the sum of its jobs' predictions."""
        done = [job for job in batch if job.state == "done"]
        starts = [job.started for job in batch if job.started is not None]
        if not done or not starts:
            return
        measured = max(job.finished for job in done) - min(starts)
        per_job = measured / len(batch)
        predicted = [job.predicted_s for job in batch]
        for job in done:  # as predicted before this batch corrects the model: what admission decided with
            self.metrics.service_seconds.observe(job.finished - (job.started or min(starts)))
            self.metrics.predicted_seconds.observe(self.seconds(job))
        with self._lock:
            self.mean_job_s = per_job if self.mean_job_s is None else \
                (1 - CORRECTION_WEIGHT) * self.mean_job_s + CORRECTION_WEIGHT * per_job
            if None not in predicted and sum(predicted) > 0:
                ratio = measured / sum(predicted)
                weight = 1.0 if self.batches == 0 else CORRECTION_WEIGHT
                self.correction = (1 - weight) * self.correction + weight * ratio
                self.batches += 1
        self.metrics.prediction_correction.set(self.correction)

    def publish(self, queue) -> None:
        """The gauges a router scores replicas on, as of now."""
        waiting, running = queue.snapshot()
        self.metrics.queue_length.set(len(waiting))
        self.metrics.in_flight.set(len(running))
        self.metrics.predicted_wait.set(self.wait_ahead(queue))


def planner_inputs(engine):
    """(Layout, ModelCosts, World) of this server's engine settings, as `meshdit plan` would price them."""
    from ..planner.auto import auto_world
    from ..planner.choose import load_model
    from ..planner.layouts import Layout

    _, _, costs = load_model(engine.model)
    config, loading = engine.config, engine.loading
    layout = Layout.of(config, vae="parallel" if engine.vae.parallel else "tiled" if engine.vae.tiled else "plain",
                       fp8=bool(engine.fp8 and engine.fp8.gemm), text_on_cpu=loading.text_encoder_device == "cpu",
                       text_parallel=bool(loading.text_encoder_parallel), offload=loading.offload == "blocks")
    return layout, costs, auto_world(config.world_size)
