"""Prometheus metrics of one server (own registry, so tests can run several servers in one process)."""
from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, disable_created_metrics, generate_latest

disable_created_metrics()  # no *_created samples: they only add noise to a scrape

OUTCOMES = ("done", "failed", "cancelled", "rejected_queue_full", "rejected_invalid", "rejected_too_large",
            "rejected_timeout", "unauthorized", "rejected_queue_seconds")


class Metrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.queue_length = Gauge("meshdit_queue_length", "Jobs waiting to run", registry=self.registry)
        self.requests = Counter("meshdit_requests", "Image requests by outcome", ["outcome"], registry=self.registry)
        for outcome in OUTCOMES:
            self.requests.labels(outcome)  # every outcome shows, at 0, from the start
        self.step_seconds = Histogram("meshdit_step_seconds", "Seconds per denoising step (whole batch)",
                                      buckets=(0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10), registry=self.registry)
        self.request_seconds = Histogram("meshdit_request_seconds", "Seconds from submission to the job's end",
                                         buckets=(0.1, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600),
                                         registry=self.registry)
        self.result_store_bytes = Gauge("meshdit_result_store_bytes", "Bytes of finished jobs' PNGs held for "
                                        "fetching (bound: --result-store-mb)", registry=self.registry)
        self.result_store_jobs = Gauge("meshdit_result_store_jobs", "Finished jobs whose PNGs are held",
                                       registry=self.registry)
        self.results_expired = Counter("meshdit_results_expired", "Results dropped, by reason (age: --result-ttl, "
                                       "bytes: --result-store-mb)", ["reason"], registry=self.registry)
        for reason in ("age", "bytes"):
            self.results_expired.labels(reason)
        self.cached_steps = Counter("meshdit_cached_steps", "Denoising steps of finished jobs whose middle "
                                    "transformer blocks the step cache skipped", registry=self.registry)
        self.computed_steps = Counter("meshdit_computed_steps", "Denoising steps of finished jobs with a step "
                                      "cache that ran every block", registry=self.registry)
        self.batch_images = Histogram("meshdit_batch_images", "Images per batch run on the mesh",
                                      buckets=(1, 2, 4, 8, 16, 32), registry=self.registry)

        # admission by predicted time (serve/admission.py), and the gauges a router scores replicas on
        latency = (0.1, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600, 1800)
        self.predicted_seconds = Histogram("meshdit_request_predicted_seconds", "Service seconds predicted for "
                                           "finished jobs (the planner's cost model x the measured correction)",
                                           buckets=latency, registry=self.registry)
        self.service_seconds = Histogram("meshdit_request_service_seconds", "Service seconds measured for finished "
                                         "jobs (start of their batch to the end)", buckets=latency,
                                         registry=self.registry)
        self.prediction_correction = Gauge("meshdit_prediction_correction", "Measured / predicted service time, "
                                           "running mean over finished batches", registry=self.registry)
        self.prediction_correction.set(1.0)
        self.predicted_wait = Gauge("meshdit_queue_predicted_seconds", "Predicted seconds of work ahead of a job "
                                    "submitted now (waiting jobs and the running batch's rest)",
                                    registry=self.registry)
        self.in_flight = Gauge("meshdit_in_flight_requests", "Jobs running on the mesh now", registry=self.registry)
        self.last_step_seconds = Gauge("meshdit_last_step_seconds", "Seconds of the latest denoising step (whole "
                                       "batch)", registry=self.registry)

    def render(self) -> bytes:
        return generate_latest(self.registry)
