"""What the HTTP thread and the output rank's loop share: settings, queue, metrics, readiness, faults."""
from __future__ import annotations

import base64
import copy
import io
import threading
import time
from dataclasses import dataclass

import numpy as np

from ..config import GenerateRequest, ParallelConfig
from ..errors import ConfigError
from .jobs import Job, JobQueue
from .metrics import Metrics
from .schemas import ImageRequest


@dataclass
class ServeSettings:
    """Everything `meshdit serve` was started with that the server needs (picklable: sent to every rank)."""

    model: str
    config: ParallelConfig
    height: int
    width: int
    steps: int | None  # None: the family's default
    guidance_scale: float | None
    max_sequence_length: int | None
    warmup_steps: int = 1  # PipeFusion's, for every request
    num_pipeline_patch: int | None = None
    kv_drift_correction: bool = True
    host: str = "127.0.0.1"
    port: int = 8000
    api_key: str | None = None
    max_queue: int = 16
    batching: bool = True
    max_batch_images: int = 8
    max_images: int = 4  # n per request
    max_pixels: int = 1024 * 1024
    request_timeout: float = 600.0  # seconds a job may run
    queue_timeout: float = 600.0  # seconds a job may wait
    dtype: str | None = None
    vae: object = None
    verbose: bool = False
    spawned: bool = True  # ranks spawned by `meshdit serve` (not torchrun): the parent forwards signals


class BadRequest(Exception):
    def __init__(self, param: str, message: str, status: int = 400) -> None:
        super().__init__(message)
        self.param, self.message, self.status = param, message, status


class ServerState:
    def __init__(self, settings: ServeSettings) -> None:
        self.settings = settings
        self.queue = JobQueue(settings.max_queue, settings.batching, settings.max_batch_images)
        self.metrics = Metrics()
        self.ready = False
        self.draining = False
        self.dead: str | None = None  # why the mesh failed
        self.info = None  # ModelInfo, once loaded
        self.tokenizers: list = []
        self._latency = 5.0  # running mean of request seconds, for Retry-After
        self._lock = threading.Lock()

    @property
    def layout(self) -> str:
        return self.settings.config.describe()

    @property
    def model_id(self) -> str:
        return "meshdit-default" if "default_model" in self.settings.model else self.settings.model

    def attach(self, engine) -> None:
        """The model is loaded on every rank: start accepting jobs."""
        self.info = engine.info
        self.settings.steps = self.settings.steps or engine.recipe.defaults.steps
        pipe = engine.pipe
        # Copies: a fast tokenizer keeps its padding / truncation settings as state that every call sets,
        # so HTTP threads counting tokens on the pipeline's own tokenizer race the rank loop's encode_prompt
        # (measured: 184 of 3000 padded encodings came out unpadded beside 4 counting threads).
        self.tokenizers = [copy.deepcopy(getattr(pipe, n)) for n in ("tokenizer", "tokenizer_2", "tokenizer_3")
                           if getattr(pipe, n, None) is not None]
        self.ready = True

    def retry_after(self) -> int:
        return max(1, int(self._latency))

    # -- requests ----------------------------------------------------------
    def make_job(self, body: ImageRequest) -> Job:
        """Checks the request against the model and layout; raises BadRequest naming the field."""
        s = self.settings
        height, width = body.dimensions((s.height, s.width))
        if height * width > s.max_pixels:
            raise BadRequest("size", f"size {body.size} has {height * width} pixels; this server allows at most "
                                     f"{s.max_pixels} (e.g. {s.width}x{s.height})")
        if body.n > s.max_images:
            raise BadRequest("n", f"n={body.n} is more than this server's limit of {s.max_images} images per request")
        if body.n < s.config.data_parallel_degree:
            raise BadRequest("n", f"n={body.n}: the layout has {s.config.data_parallel_degree} data-parallel groups "
                                  f"and needs at least that many images per request")
        scale = s.guidance_scale if body.guidance_scale is None else float(body.guidance_scale)
        if body.negative_prompt is not None and not self.info.runs_cfg(scale):
            raise BadRequest("negative_prompt", "negative_prompt is unused by this model at this guidance_scale "
                                                "(no classifier-free guidance): remove it")
        extra = {} if s.max_sequence_length is None else {"max_sequence_length": s.max_sequence_length}
        steps = body.steps or s.steps
        cache = self._cache_settings(body)
        request = GenerateRequest(prompt=body.prompt, negative_prompt=body.negative_prompt, height=height,
                                  width=width, num_inference_steps=steps, guidance_scale=scale, seed=body.seed,
                                  num_images_per_prompt=body.n, warmup_steps=s.warmup_steps,
                                  num_pipeline_patch=s.num_pipeline_patch,
                                  kv_drift_correction=s.kv_drift_correction, cache=cache, extra=extra)
        try:
            self.info.check_cache(s.config, request)
        except ConfigError as exc:
            raise BadRequest("cache", f"cache: {exc}") from None
        try:
            self.info.check(s.config, height, width, scale, body.n, request.patches(s.config))
        except ConfigError as exc:
            param = "guidance_scale" if "CFG" in str(exc) else "size"
            raise BadRequest(param, f"{param}: {exc}") from None
        self._check_prompt_length("prompt", body.prompt)
        if body.negative_prompt:
            self._check_prompt_length("negative_prompt", body.negative_prompt)
        key = (height, width, steps, scale, body.negative_prompt is None, cache)  # other caches: other batches
        if self.info.draws_noise_each_step:  # each request keeps its own generator: it never shares a batch
            key += (id(request),)
        return Job(request, key, body.n, steps)

    @staticmethod
    def _cache_settings(body: ImageRequest):
        """The body's `cache` as CacheSettings, checked (the messages name the CLI flags of the fields)."""
        from ..cache import CacheSettings

        if body.cache is None:
            return CacheSettings()
        values = body.cache.model_dump()
        settings = CacheSettings(**dict(values, compute_steps=tuple(values["compute_steps"])))
        try:
            settings.validate()
        except ConfigError as exc:
            raise BadRequest("cache", f"cache: {exc}") from None
        return settings

    def _check_prompt_length(self, param: str, text: str) -> None:
        """Refuses what the text encoders would silently cut off."""
        for tokenizer in self.tokenizers:
            clip = "clip" in type(tokenizer).__name__.lower()
            limit = tokenizer.model_max_length if clip or not self.settings.max_sequence_length \
                else self.settings.max_sequence_length
            count = len(tokenizer(text, truncation=False).input_ids)
            if count > limit:
                raise BadRequest(param, f"{param} is {count} tokens for {type(tokenizer).__name__}; the model reads "
                                        f"at most {limit}: shorten it")

    # -- the rank loop's side ----------------------------------------------
    def progress(self, batch: list[Job]):
        """on_step for a batch: records progress; asks to stop once every job in it is cancelled or too old."""
        last = [time.perf_counter()]

        def on_step(step: int, total: int) -> bool:
            now = time.perf_counter()
            if step > 0:
                self.metrics.step_seconds.observe(now - last[0])
            last[0] = now
            live = []
            for job in batch:
                if job.state != "running":
                    continue
                job.step = step
                if job.cancel_requested:
                    self._end(job, "cancelled")
                elif time.time() - job.started > self.settings.request_timeout:
                    self._end(job, "failed", f"ran past the server's request time limit "
                                             f"({self.settings.request_timeout:g} s)", 504)
                else:
                    live.append(job)
            return not live

        return on_step

    def finish(self, batch: list[Job], results) -> None:
        for job, result in zip(batch, results):
            if job.state == "running":
                job.pngs = [png_bytes(image) for image in result.images]
                job.step = job.steps
                if result.cache is not None:
                    job.cached_steps = result.cache.cached_steps()
                    self.metrics.cached_steps.inc(job.cached_steps)
                    self.metrics.computed_steps.inc(job.steps - job.cached_steps)
                self._end(job, "done")

    def stopped(self, batch: list[Job], step: int) -> None:
        for job in batch:
            if job.state == "running":
                job.step = step
                self._end(job, "cancelled")

    def fail(self, batch: list[Job], message: str, status: int) -> None:
        for job in batch:
            if job.state not in ("done", "failed", "cancelled"):
                self._end(job, "failed", message, status)

    def mark_dead(self, message: str, running: list[Job]) -> None:
        self.dead = message
        self.fail(running, message, 503)
        for job in self.queue.fail_waiting(message, 503):
            self.metrics.requests.labels("failed").inc()

    def drain(self) -> None:
        """SIGTERM / Ctrl-C: no new jobs; waiting ones fail with a clear status; the running batch finishes."""
        self.draining = True
        for job in self.queue.fail_waiting("the server is shutting down (SIGTERM); resubmit elsewhere", 503):
            self.metrics.requests.labels("failed").inc()

    def expire_waiting(self) -> None:
        limit = self.settings.queue_timeout
        for job in self.queue.fail_waiting(f"waited longer than the server's queue time limit ({limit:g} s)", 504,
                                           older_than=time.time() - limit):
            self.metrics.requests.labels("failed").inc()

    def _end(self, job: Job, state: str, error: str | None = None, status: int = 200) -> None:
        self.queue.end(job, state, error, status)
        self.metrics.requests.labels(state).inc()
        seconds = job.finished - job.created
        self.metrics.request_seconds.observe(seconds)
        with self._lock:
            self._latency = 0.8 * self._latency + 0.2 * seconds


def png_bytes(image: np.ndarray) -> bytes:
    """[H, W, 3] float in [0, 1] -> PNG, rounded as `meshdit generate` saves it."""
    from PIL import Image

    buffer = io.BytesIO()
    Image.fromarray((np.clip(image, 0, 1) * 255).round().astype(np.uint8)).save(buffer, format="PNG")
    return buffer.getvalue()


def b64(png: bytes) -> str:
    return base64.b64encode(png).decode("ascii")
