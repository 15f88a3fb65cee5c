"""What the HTTP thread and the output rank's loop share: settings, queue, metrics, readiness, faults."""
from __future__ import annotations

import base64
import copy
import dataclasses
import io
import re
import threading
import time
from dataclasses import dataclass

import numpy as np

from ..config import GenerateRequest, ParallelConfig
from ..engine_settings import EngineSettings
from ..errors import ConfigError, RequestFieldError
from ..request import ResolvedRequest, as_request, batch_key, resolve_request
from ..input_image import open_image
from .admission import Admission
from .jobs import Job, JobQueue
from .limits import BODY_TIMEOUT_S, DRAIN_GRACE_S, MAX_BODY_BYTES, MAX_FRAMES, RESULT_STORE_MB, RESULT_TTL_S
from .metrics import Metrics
from .results import ResultStore
from .schemas import PER_REQUEST_FIELDS

FIRST_EXPERT, SECOND_EXPERT = "transformer", "transformer_2"  # loading/lora.py's names (no torch here)
PARAMS = {"height": "size", "width": "size", "num_inference_steps": "steps", "num_images_per_prompt": "n"}
"""A request field (RequestFieldError.field) -> the body's field that sets it, where the names differ."""


@dataclass
class ServeSettings:
    """Everything `meshdit serve` was started with that the server needs (picklable: sent to every rank)."""

    engine: EngineSettings
    """How every rank builds its engine: the same settings `meshdit generate` gives its ranks."""
    request: GenerateRequest | ResolvedRequest
    """Every request's defaults: serve's flags resolved with the model's defaults before the ranks start."""
    flags: GenerateRequest | None = None
    """Every request's base: what serve's flags set, unset values unset (None: `request`). A request's own values
    (prompt, n, size, steps, seed, extra, ...) replace them in make_job, and request.resolve_request fills what both
    leave unset from the model's defaults, as for generate and the API."""
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
        """The LoRA adapters requests may name in `loras` (serve's --lora-dir: the first denoiser's)."""
        return self._adapters_of(FIRST_EXPERT)

    @property
    def adapters_2(self) -> list[str]:
        """Those requests may name in `loras_2` (--lora-2-dir: Wan 2.2's second expert, transformer_2)."""
        return self._adapters_of(SECOND_EXPERT)

    def _adapters_of(self, expert: str) -> list[str]:
        experts = dict(self.settings.engine.lora_experts)
        return [name for name, _ in self.settings.engine.loras if expert in experts.get(name, (FIRST_EXPERT,))]

    def _loras(self, body) -> tuple:
        """((name, weight), ...) of the request's `loras` and `loras_2`; an adapter this server does not hold is a
        400 naming it. An adapter in both experts (a file in both folders) has one weight, as generate's."""
        chosen: dict[str, float] = {}
        for param, held, flag in (("loras", self.adapters, "--lora-dir"), ("loras_2", self.adapters_2, "--lora-2-dir")):
            names = [c.name for c in getattr(body, param)]
            if len(set(names)) < len(names):
                raise BadRequest(param, f"{param}: an adapter is named twice")
            for choice in getattr(body, param):
                if choice.name not in held:
                    have = ", ".join(held) or f"none (start it with {flag})"
                    raise BadRequest(param, f"{param}: this server has no LoRA adapter named {choice.name!r}; it "
                                            f"has: {have}")
                if chosen.get(choice.name, choice.weight) != choice.weight:
                    raise BadRequest(param, f"{param}: {choice.name!r} is in both experts and has one weight; give "
                                            f"it the same weight in loras and loras_2")
                chosen[choice.name] = float(choice.weight)
        return tuple(chosen.items())

    @property
    def given_request(self) -> GenerateRequest:
        """Every request's base: what serve's flags set (unset values stay unset, for the model's defaults)."""
        r = self.settings.flags or self.settings.request
        return as_request(r) if isinstance(r, ResolvedRequest) else r

    def resolved_defaults(self) -> ResolvedRequest:
        """What a request that sets nothing resolves to (its prompt aside): `request`, resolved before the ranks
        started (serve_settings), or resolved now (as given while no model is attached)."""
        r = self.settings.request
        return r if isinstance(r, ResolvedRequest) or self.info is None else resolve_request(r, self.info)

    def defaults(self) -> dict:
        """What a request leaves unset becomes (the web page prefills these)."""
        r = self.resolved_defaults()
        video = {"num_frames": r.num_frames, "fps": r.fps} if r.num_frames is not None else {}  # a video model's
        return {"size": f"{r.width}x{r.height}", "steps": r.num_inference_steps, **video}

    def retry_after(self) -> int:
        return max(1, int(self._latency))

    # -- requests ----------------------------------------------------------
    def make_job(self, body, video: dict | None = None, params: dict | None = None) -> Job:
        """The job of an image request (ImageRequest; a VideoRequest with `video`: its num_frames, fps and input
        image), resolved by request.resolve_request against the model and layout; a refusal is a BadRequest naming
        the body's field (params: GenerateRequest field -> the body's field, beside PARAMS)."""
        s, params = self.settings, {**PARAMS, **(params or {})}
        n = getattr(body, "n", 1)  # a video request makes one video
        if n > s.max_images:
            raise BadRequest("n", f"n={n} is more than this server's limit of {s.max_images} images per request")
        if n < s.config.data_parallel_degree:
            raise BadRequest("n", f"n={n}: the layout has {s.config.data_parallel_degree} data-parallel groups "
                                  f"and needs at least that many images per request")
        video = dict(video or {})
        image = self._image(video.pop("image") if "image" in video else body.image)
        given = self.given_request
        values = dict(prompt=body.prompt, negative_prompt=body.negative_prompt, seed=body.seed,
                      num_images_per_prompt=n, loras=self._loras(body), image=image,
                      cache=self._cache_settings(body, given.cache), **video)
        if body.size is not None:
            values["height"], values["width"] = body.dimensions((None, None))
        if body.steps is not None:
            values["num_inference_steps"] = body.steps
        if body.guidance_scale is not None:
            values["guidance_scale"] = float(body.guidance_scale)
        values.update({name: getattr(body, name) for name in PER_REQUEST_FIELDS if getattr(body, name) is not None})
        if body.extra is not None:  # the body's keys over the server's (--extra, --max-sequence-length)
            values["extra"] = {**given.extra, **body.extra}
        request = dataclasses.replace(given, **values)
        try:
            resolved = resolve_request(request, self.info)
            if resolved.height * resolved.width > s.max_pixels:
                defaults = self.resolved_defaults()
                raise RequestFieldError("height", f"size {resolved.width}x{resolved.height} has "
                                                  f"{resolved.height * resolved.width} pixels; this server allows at "
                                                  f"most {s.max_pixels} (e.g. {defaults.width}x{defaults.height})")
            if body.negative_prompt is not None and not self.info.runs_cfg(resolved.guidance_scale):
                raise RequestFieldError("negative_prompt", "negative_prompt is unused by this model at this "
                                                           "guidance_scale (no classifier-free guidance): remove it")
            resolved = resolve_request(resolved, self.info, s.config)
        except RequestFieldError as exc:
            raise self.bad_request(exc, params, request) from None
        except ConfigError as exc:  # the model or the layout alone (no field of the request)
            raise BadRequest(None, str(exc)) from None
        self._check_prompt_length("prompt", body.prompt, resolved)
        if body.negative_prompt:
            self._check_prompt_length("negative_prompt", body.negative_prompt, resolved)
        return Job(resolved, batch_key(resolved, self.info, s.config), n, resolved.num_inference_steps)

    @staticmethod
    def bad_request(exc: RequestFieldError, params: dict, request: GenerateRequest) -> BadRequest:
        """The 400 of a refusal: the body's field that RequestFieldError.field names (PARAMS), its message with
        generate's --height / --width advice worded for `size`."""
        param = params.get(exc.field, exc.field)
        message = str(exc)
        if param == "size" and request.height is not None:
            message = size_terms(message, request.height, request.width)
        return BadRequest(param, message if message.startswith(f"{param}:") else f"{param}: {message}")

    def _image(self, given: str | None):
        """The request's input image (base64 or a data: URL) as an RGB PIL image, or None (its SHA-256, which the
        batch key holds, is ResolvedRequest.image_key); a model that takes none, one it needs missing, or a file that
        is no image or too large: a 400 naming `image`."""
        what = self.info.pipeline_class
        if given is None:
            if self.info.needs_image:
                raise BadRequest("image", f"image: this {what} edits an image: send the image to edit")
            return None
        if not self.info.takes_image:
            raise BadRequest("image", f"image: this {what} makes images from text alone and takes no image: "
                                      "drop `image` (or serve an image-edit model such as FLUX.1 Kontext)")
        text = given.split(",", 1)[1] if given.startswith("data:") else given  # a data: URL
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
        return image

    @staticmethod
    def _cache_settings(body, default):
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

    def _check_prompt_length(self, param: str, text: str, request: ResolvedRequest) -> None:
        """Refuses what the text encoders would silently cut off."""
        for tokenizer in self.tokenizers:
            clip = "clip" in type(tokenizer).__name__.lower()
            text_tokens = request.extra.get("max_sequence_length")
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
