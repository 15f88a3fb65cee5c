"""What the HTTP thread and the output rank's loop share: settings, queue, metrics, readiness, faults."""
from __future__ import annotations

import base64
import copy
import dataclasses
import hashlib
import io
import re
import threading
import time
from dataclasses import dataclass

import numpy as np

from ..config import GenerateRequest, ParallelConfig
from ..engine_settings import EngineSettings
from ..errors import ConfigError
from ..input_image import open_image
from .admission import Admission
from .jobs import Job, JobQueue
from .limits import BODY_TIMEOUT_S, DRAIN_GRACE_S, MAX_BODY_BYTES, MAX_FRAMES, RESULT_STORE_MB, RESULT_TTL_S
from .metrics import Metrics
from .results import ResultStore
from .schemas import ImageRequest


@dataclass
class ServeSettings:
    """Everything `meshdit serve` was started with that the server needs (picklable: sent to every rank)."""

    engine: EngineSettings
    """How every rank builds its engine: the same settings `meshdit generate` gives its ranks."""
    request: GenerateRequest
    """Every request's defaults, with the model's filled in before the ranks start (ModelInfo.request_defaults,
    as for generate and the API): size, steps, guidance, text length, PipeFusion's settings. A request's own
    values (prompt, n, size, steps, seed, ...) replace them in make_job."""
    host: str = "127.0.0.1"
    port: int = 8000
    api_key: str | None = None
    max_queue: int = 16
    batching: bool = True
    max_batch_images: int = 8
    max_images: int = 4  # n per request
    max_pixels: int = 1024 * 1024
    max_frames: int = MAX_FRAMES  # frames per video request
    request_timeout: float = 600.0  # seconds a job may run
    queue_timeout: float = 600.0  # seconds a job may wait
    max_queue_seconds: float | None = None  # predicted wait beyond which a job gets 429 (None: no such limit)
    max_body_bytes: int = MAX_BODY_BYTES  # larger request bodies get 413, unread
    body_timeout: float = BODY_TIMEOUT_S  # seconds a request body may take to arrive whole (else 408)
    result_store_bytes: int = RESULT_STORE_MB << 20  # finished jobs' PNGs held; the oldest expire beyond it
    result_ttl: float = RESULT_TTL_S  # seconds a finished job's PNGs are held
    drain_grace: float = DRAIN_GRACE_S  # seconds a job that finished during a drain stays fetchable
    spawned: bool = True  # ranks spawned by `meshdit serve` (not torchrun): the parent forwards signals

    @property
    def config(self) -> ParallelConfig:
        return self.engine.config

    @property
    def model(self) -> str:
        return self.engine.model


class BadRequest(Exception):
    def __init__(self, param: str, message: str, status: int = 400) -> None:
        super().__init__(message)
        self.param, self.message, self.status = param, message, status


class ServerState:
    def __init__(self, settings: ServeSettings) -> None:
        self.settings = settings
        self.queue = JobQueue(settings.max_queue, settings.batching, settings.max_batch_images)
        self.metrics = Metrics()
        self.results = ResultStore(settings.result_store_bytes, settings.result_ttl, self.metrics)
        self.admission = Admission(settings, self.metrics)
        self.ready = False
        self.draining = False
        self.drain_started: float | None = None
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
        pipe = engine.pipe
        # Copies: a fast tokenizer keeps its padding / truncation settings as state that every call sets,
        # so HTTP threads counting tokens on the pipeline's own tokenizer race the rank loop's encode_prompt
        # (seen: padded encodings came out unpadded beside counting threads; docs/figures.md).
        self.tokenizers = [copy.deepcopy(getattr(pipe, n)) for n in ("tokenizer", "tokenizer_2", "tokenizer_3")
                           if getattr(pipe, n, None) is not None]
        self.admission.start()
        self.ready = True

    @property
    def adapters(self) -> list[str]:
        """The LoRA adapters requests may name (serve's --lora-dir)."""
        return [name for name, _ in self.settings.engine.loras]

    def _loras(self, body: ImageRequest) -> tuple:
        """((name, weight), ...) of the request; an adapter this server does not hold is a 400 naming it."""
        for choice in body.loras:
            if choice.name not in self.adapters:
                have = ", ".join(self.adapters) or "none (start it with --lora-dir)"
                raise BadRequest("loras", f"loras: this server has no LoRA adapter named {choice.name!r}; it has: "
                                          f"{have}")
        if len({c.name for c in body.loras}) < len(body.loras):
            raise BadRequest("loras", "loras: an adapter is named twice")
        return tuple((c.name, float(c.weight)) for c in body.loras)

    def defaults(self) -> dict:
        """What a request leaves unset becomes (the web page prefills these)."""
        r = self.settings.request
        video = {"num_frames": r.num_frames, "fps": r.fps} if r.num_frames is not None else {}  # a video model's
        return {"size": f"{r.width}x{r.height}", "steps": r.num_inference_steps, **video}

    def retry_after(self) -> int:
        return max(1, int(self._latency))

    # -- requests ----------------------------------------------------------
    def make_job(self, body: ImageRequest) -> Job:
        """Checks the request against the model and layout; raises BadRequest naming the field."""
        s, defaults = self.settings, self.settings.request
        height, width = body.dimensions((defaults.height, defaults.width))
        if height * width > s.max_pixels:
            raise BadRequest("size", f"size {body.size} has {height * width} pixels; this server allows at most "
                                     f"{s.max_pixels} (e.g. {defaults.width}x{defaults.height})")
        if body.n > s.max_images:
            raise BadRequest("n", f"n={body.n} is more than this server's limit of {s.max_images} images per request")
        if body.n < s.config.data_parallel_degree:
            raise BadRequest("n", f"n={body.n}: the layout has {s.config.data_parallel_degree} data-parallel groups "
                                  f"and needs at least that many images per request")
        scale = defaults.guidance_scale if body.guidance_scale is None else float(body.guidance_scale)
        model = self.info.request_defaults()
        if body.guidance_scale is None and body.negative_prompt is not None and \
                model.guidance_without_negative_prompt == scale:  # FLUX.1, Qwen-Image: true CFG's own default
            scale = model.guidance_scale
        if body.negative_prompt is not None and not self.info.runs_cfg(scale):
            raise BadRequest("negative_prompt", "negative_prompt is unused by this model at this guidance_scale "
                                                "(no classifier-free guidance): remove it")
        steps = body.steps or defaults.num_inference_steps
        loras = self._loras(body)
        image, image_digest = self._image(body)
        request = dataclasses.replace(defaults, prompt=body.prompt, negative_prompt=body.negative_prompt,
                                      height=height, width=width, num_inference_steps=steps, guidance_scale=scale,
                                      seed=body.seed, num_images_per_prompt=body.n, extra=dict(defaults.extra),
                                      cache=self._cache_settings(body, defaults.cache), loras=loras, image=image)
        cache = request.cache
        try:
            self.info.check_cache(s.config, request)
        except ConfigError as exc:
            raise BadRequest("cache", f"cache: {exc}") from None
        try:
            self.info.check(s.config, height, width, scale, body.n, request.patches(s.config))
        except ConfigError as exc:
            param = "guidance_scale" if "CFG" in str(exc) else "size"
            message = size_terms(str(exc), height, width) if param == "size" else str(exc)
            raise BadRequest(param, f"{param}: {message}") from None
        self._check_prompt_length("prompt", body.prompt)
        if body.negative_prompt:
            self._check_prompt_length("negative_prompt", body.negative_prompt)
        # other caches, adapters or input images: other batches (one batch shares the image's token ids)
        key = (height, width, steps, scale, body.negative_prompt is None, cache, loras, image_digest)
        if self.info.draws_noise_each_step:  # each request keeps its own generator: it never shares a batch
            key += (id(request),)
        return Job(request, key, body.n, steps)

    def _image(self, body: ImageRequest):
        """(the request's input image as an RGB PIL image, the SHA-256 of its file) or (None, None); a model that
        takes none, one it needs missing, or a file that is no image or too large: a 400 naming `image`."""
        what = self.info.pipeline_class
        if body.image is None:
            if self.info.needs_image:
                raise BadRequest("image", f"image: this {what} edits an image: send the image to edit")
            return None, None
        if not self.info.takes_image:
            raise BadRequest("image", f"image: this {what} makes images from text alone and takes no image: "
                                      "drop `image` (or serve an image-edit model such as FLUX.1 Kontext)")
        text = body.image.split(",", 1)[1] if body.image.startswith("data:") else body.image  # a data: URL
        text = "".join(text.split())  # MIME base64 (`base64` without -w 0) breaks lines every 76 characters
        try:
            data = base64.b64decode(text, validate=True)
        except ValueError:
            raise BadRequest("image", "image: not base64; send the image file base64-encoded (or upload it as "
                                      "multipart/form-data)") from None
        try:
            image = open_image(data, "image")
        except ConfigError as exc:
            raise BadRequest("image", str(exc)) from None
        return image, hashlib.sha256(data).hexdigest()

    @staticmethod
    def _cache_settings(body: ImageRequest, default):
        """The body's `cache` as CacheSettings, checked (the messages name the CLI flags of the fields); without
        one, the server's (`meshdit serve --cache ...`, default: none)."""
        from ..cache import CacheSettings

        if body.cache is None:
            return default
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
            text_tokens = self.settings.request.extra.get("max_sequence_length")
            limit = tokenizer.model_max_length if clip or not text_tokens else text_tokens
            count = len(tokenizer(text, truncation=False).input_ids)
            if count > limit:
                raise BadRequest(param, f"{param} is {count} tokens for {type(tokenizer).__name__}; the model reads "
                                        f"at most {limit}: shorten it")

    def remote_job(self, job_id: str):
        """A job another replica holds (none here: one server; serve/ray_app.py's replicas look on their board)."""
        return None

    def cancel(self, job: Job) -> None:
        self.queue.cancel(job)

    def answers_when_dead(self, method: str, path: str) -> bool:
        """Whether a request is still answered after the mesh failed (one server: none, it is stopping)."""
        return False

    # -- the rank loop's side ----------------------------------------------
    def progress(self, batch: list[Job]):
        """on_step for a batch: records progress; asks to stop once every job in it is cancelled or too old."""
        last = [time.perf_counter()]

        def on_step(step: int, total: int) -> bool:
            now = time.perf_counter()
            if step > 0:
                self.metrics.step_seconds.observe(now - last[0])
                self.metrics.last_step_seconds.set(now - last[0])
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
                job.pngs = [encode(job.request, image) for image in result.images]
                job.step = job.steps
                if result.cache is not None:
                    job.cached_steps = result.cache.cached_steps()
                    self.metrics.cached_steps.inc(job.cached_steps)
                    self.metrics.computed_steps.inc(job.steps - job.cached_steps)
                self._end(job, "done")
                self.results.add(job)
        self.admission.observe(batch)

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

    def begin_drain(self) -> None:
        """From the signal handler: from now on new jobs get 503 and /health says draining."""
        if self.drain_started is None:
            self.drain_started = time.time()
        self.draining = True

    def drain(self) -> None:
        """SIGTERM / Ctrl-C: no new jobs; waiting ones fail with a clear status; the running batch finishes.
        Called by the rank loop until it stops (a job may slip in while the signal arrives)."""
        self.begin_drain()
        for job in self.queue.fail_waiting("the server is shutting down (SIGTERM); resubmit elsewhere", 503):
            self.metrics.requests.labels("failed").inc()

    def may_stop(self) -> bool:
        """Draining and between batches: no job that finished during the drain still has images nobody fetched,
        or --drain-grace has passed since the last of them finished."""
        unfetched = [job.finished for job in self.results.held()
                     if job.finished >= self.drain_started and len(job.fetched) < len(job.pngs)]
        return not unfetched or time.time() > max(unfetched) + self.settings.drain_grace

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


_CLI_SIZES = (  # ModelInfo.check's advice in generate's flags -> the same advice in the request's `size` (WxH)
    (r"use --height (\d+) --width (\d+)", lambda m, h, w: f"use size {m[2]}x{m[1]}"),
    (r"use --height (\d+) or (\d+)", lambda m, h, w: f"use size {w}x{m[1]} or {w}x{m[2]}"),
    (r"use --width (\d+) or (\d+)", lambda m, h, w: f"use size {m[1]}x{h} or {m[2]}x{h}"),
    (r"use --height >= (\d+)", lambda m, h, w: f"use a size at least {m[1]} pixels high (size {w}x{m[1]})"),
    (r"use (?:--)?height and (?:--)?width <= (\d+)", lambda m, h, w: f"use a size of at most {m[1]}x{m[1]}"),
    (r"a larger --height", lambda m, h, w: "a larger height (the H of size WxH)"),
    (r"raise the resolution", lambda m, h, w: "raise the size"),
)


def size_terms(message: str, height: int, width: int) -> str:
    """A size refusal worded for generate's --height / --width, reworded for the request's `size` field."""
    for pattern, advice in _CLI_SIZES:
        message = re.sub(pattern, lambda m: advice(m, height, width), message)
    return message.replace("--height", "the height in `size`").replace("--width", "the width in `size`")


def png_bytes(image: np.ndarray) -> bytes:
    """[H, W, 3] float in [0, 1] -> PNG, rounded as `meshdit generate` saves it."""
    from PIL import Image

    buffer = io.BytesIO()
    Image.fromarray((np.clip(image, 0, 1) * 255).round().astype(np.uint8)).save(buffer, format="PNG")
    return buffer.getvalue()


def encode(request: GenerateRequest, image) -> bytes:
    """A result as the file `meshdit generate` writes for it: an image [H, W, 3] as PNG, a video [F, H, W, 3] as
    the MP4 of output.save_videos at the request's fps."""
    if image.ndim == 4:
        from ..output import video_file_bytes

        return video_file_bytes(image, request.fps)
    return png_bytes(image)


def b64(png: bytes) -> str:
    return base64.b64encode(png).decode("ascii")
