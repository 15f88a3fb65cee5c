"""The HTTP API (FastAPI): OpenAI's image endpoints, async jobs, health, metrics and the web page."""
from __future__ import annotations

import asyncio
import hmac
import json
import time
from pathlib import Path

from fastapi import FastAPI, Request
from fastapi.responses import HTMLResponse, JSONResponse, Response, StreamingResponse
from pydantic import ValidationError

from .jobs import TERMINAL, Job, QueueFull
from .schemas import ImageRequest
from .server_state import BadRequest, ServerState, b64

PUBLIC = ("/", "/health", "/metrics")
_PAGE = Path(__file__).with_name("page.html")


def error(status: int, message: str, param: str | None = None, headers: dict | None = None) -> JSONResponse:
    """OpenAI's error shape, which its client turns into the matching exception."""
    kind = "invalid_request_error" if status < 500 else "server_error"
    return JSONResponse({"error": {"message": message, "type": kind, "param": param, "code": None}},
                        status_code=status, headers=headers)


class BodyTimeout(Exception):
    """The body did not arrive whole in time (a client that stalls, or sends a byte a minute)."""


async def read_body(request: Request, limit: int, timeout: float = float("inf")) -> bytes | None:
    """The body, or None once it is known to exceed `limit` bytes: from Content-Length before reading
    any of it, else (chunked) as soon as the bytes read pass the limit; the rest is never read. Raises
    BodyTimeout if the whole body has not arrived `timeout` seconds after the request's head."""
    declared = request.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > limit:
        return None
    chunks, size = [], 0
    stream = request.stream().__aiter__()
    deadline = time.monotonic() + timeout
    while True:
        try:
            chunk = await asyncio.wait_for(stream.__anext__(), max(0.0, deadline - time.monotonic()))
        except StopAsyncIteration:
            return b"".join(chunks)
        except asyncio.TimeoutError:
            raise BodyTimeout() from None
        size += len(chunk)
        if size > limit:
            return None
        chunks.append(chunk)


async def client_leaves(request: Request) -> None:
    """Returns once the client has closed the connection (its body was read already: what arrives now is the
    disconnect)."""
    while (await request.receive())["type"] != "http.disconnect":
        pass


class BadForm(ValueError):
    def __init__(self, param: str, message: str) -> None:
        super().__init__(message)
        self.param = param


TEXT_FIELDS = {"prompt", "negative_prompt", "size", "model", "user", "response_format"}
"""Form fields taken as text; the others are JSON (numbers, and `cache` / `loras` as JSON text)."""


async def form_fields(headers, raw: bytes, file_field: str = "image", text_fields=TEXT_FIELDS) -> dict:
    """A multipart/form-data body -> the JSON body it stands for: the uploaded `image` (OpenAI's client names a
    list of them `image[]`) base64-encoded, numbers and JSON fields parsed; the image model checks the rest.
    file_field, text_fields: another endpoint's (POST /v1/videos: `input_reference`, serve/videos.py)."""
    import base64

    from starlette.formparsers import MultiPartException, MultiPartParser

    try:
        import python_multipart  # noqa: F401  (starlette's parser runs on it)
    except ImportError:
        raise BadForm("content-type", "this server cannot read multipart/form-data (install python-multipart: "
                                      "pip install meshdit[serve]); send JSON with the image in base64") from None
    async def stream():
        yield raw

    try:
        form = await MultiPartParser(headers, stream(), max_files=2, max_fields=64).parse()
    except MultiPartException as exc:
        raise BadForm("body", f"the multipart/form-data body cannot be read: {exc.message}") from None
    data = {}
    for name, value in form.multi_items():
        name = file_field if name == f"{file_field}[]" else name
        if name in data:
            raise BadForm(name, f"{name}: sent twice; this server takes one" + (" image" if name == file_field else ""))
        if name == "mask":
            raise BadForm("mask", "mask: not supported; the model edits the whole image from the prompt")
        if not isinstance(value, str):  # an uploaded file
            if name != file_field:
                raise BadForm(name, f"{name}: a file where text was expected; only `{file_field}` is a file")
            data[name] = base64.b64encode(await value.read()).decode("ascii")
        elif name in text_fields or name == file_field:
            data[name] = value
        else:
            try:
                data[name] = json.loads(value)
            except ValueError:
                data[name] = value  # the model's validation names the field
    return data


async def request_fields(request: Request, state: ServerState, file_field: str = "image",
                         text_fields=TEXT_FIELDS) -> dict | JSONResponse:
    """A request's body (JSON, or multipart/form-data: form_fields) as a dict, or the error answering it: 415 for
    another content type, 413 past --max-body-bytes, 408 past --body-timeout, 400 for a body that cannot be read."""
    content_type = request.headers.get("content-type", "")
    multipart = content_type.startswith("multipart/form-data")
    if "application/json" not in content_type and not multipart:
        return error(415, "Content-Type must be application/json or multipart/form-data", "content-type")
    try:
        raw = await read_body(request, state.settings.max_body_bytes, state.settings.body_timeout)
    except BodyTimeout:
        state.metrics.requests.labels("rejected_timeout").inc()
        return error(408, f"the body did not arrive whole within this server's limit of "
                          f"{state.settings.body_timeout:g} s (--body-timeout); send it at once", "body",
                     headers={"Connection": "close"})
    if raw is None:
        state.metrics.requests.labels("rejected_too_large").inc()
        return error(413, f"the body is larger than this server's limit of {state.settings.max_body_bytes} "
                          "bytes (--max-body-bytes); an image request needs a few KB, one with an input image "
                          "about the image file's size", "body",
                     headers={"Connection": "close"})  # uvicorn then closes without reading the rest
    try:
        return await form_fields(request.headers, raw, file_field, text_fields) if multipart else json.loads(raw)
    except RecursionError:  # json's parser recurses per level: a deep body would otherwise answer 500
        state.metrics.requests.labels("rejected_invalid").inc()
        return error(400, "the body's JSON is nested too deeply (an image request is one flat object)", "body")
    except BadForm as exc:
        state.metrics.requests.labels("rejected_invalid").inc()
        return error(400, str(exc), exc.param)
    except (ValueError, UnicodeDecodeError) as exc:
        state.metrics.requests.labels("rejected_invalid").inc()
        return error(400, f"the body is not valid JSON: {exc}", "body")


def job_or_error(state: ServerState, make) -> Job | JSONResponse:
    """make(): a request's job from its validated body; a body the schema or the model refuses is a 400 naming the
    field (images and videos alike)."""
    try:
        return make()
    except ValidationError as exc:
        state.metrics.requests.labels("rejected_invalid").inc()
        first = exc.errors()[0]
        param = ".".join(str(p) for p in first["loc"]) or "body"
        return error(400, f"{param}: {first['msg']}", param)
    except BadRequest as exc:
        state.metrics.requests.labels("rejected_invalid").inc()
        return error(exc.status, exc.message, exc.param)


def admit(state: ServerState, job: Job) -> JSONResponse | None:
    """Queues the job, or answers 429 with Retry-After: the queue is full (--max-queue), or the predicted wait
    exceeds --max-queue-seconds (serve/admission.py)."""
    state.admission.price(job)
    refused = state.admission.refusal(state.queue, job)
    if refused is not None:
        wait, retry = refused
        state.metrics.requests.labels("rejected_queue_seconds").inc()
        return error(429, f"the predicted wait is {wait:.1f} s (the work queued ahead and this job's own), more than "
                          f"this server's --max-queue-seconds {state.settings.max_queue_seconds:g}; retry in {retry} s "
                          "or elsewhere", headers={"Retry-After": str(retry)})
    try:
        state.queue.submit(job)
    except QueueFull:
        state.metrics.requests.labels("rejected_queue_full").inc()
        return error(429, f"the queue is full ({state.settings.max_queue} jobs waiting); retry later",
                     headers={"Retry-After": str(state.retry_after())})
    state.metrics.queue_length.set(len(state.queue))
    return None


def create_app(state: ServerState) -> FastAPI:
    app = FastAPI(title="meshdit", docs_url=None, redoc_url=None, openapi_url=None)

    @app.middleware("http")
    async def gate(request: Request, call_next):
        path = request.url.path
        if path not in PUBLIC:
            key = state.settings.api_key
            given = request.headers.get("authorization", "")
            if key and not hmac.compare_digest(given.encode(), f"Bearer {key}".encode()):
                state.metrics.requests.labels("unauthorized").inc()
                return error(401, "missing or wrong API key: send 'Authorization: Bearer <key>'", "authorization")
            if state.dead and not state.answers_when_dead(request.method, path):
                return error(503, f"the mesh failed and the server is stopping: {state.dead}")
            if not state.ready:
                return error(503, "the model is still loading on the ranks; retry shortly",
                             headers={"Retry-After": "5"})
        return await call_next(request)

    @app.get("/", response_class=HTMLResponse)
    async def page():
        return HTMLResponse(_PAGE.read_text())

    @app.get("/health")
    async def health():
        status = "failed" if state.dead else "draining" if state.draining else "ready" if state.ready else "loading"
        body = {"status": status, "layout": state.layout, "world_size": state.settings.config.world_size,
                "model": state.model_id, "queue": len(state.queue),
                "defaults": state.defaults()}
        if state.dead:
            body["error"] = state.dead
        return JSONResponse(body, status_code=200 if status == "ready" else 503)

    @app.get("/metrics")
    async def metrics():
        state.admission.publish(state.queue)  # queue length, in flight, predicted wait
        return Response(state.metrics.render(), media_type="text/plain; version=0.0.4; charset=utf-8")

    @app.get("/v1/models")
    async def models():
        adapters = [{"id": name, "object": "model", "created": 0, "owned_by": "meshdit", "parent": state.model_id,
                     "type": "lora"} for name in state.adapters]  # what a request's `loras` may name
        return {"object": "list", "data": [{"id": state.model_id, "object": "model", "created": 0,
                                            "owned_by": "meshdit"}, *adapters]}

    async def submit(request: Request, pinned: bool = False, edit: bool = False) -> Job | JSONResponse:
        """edit: /v1/images/edits, which needs a model that takes an image, and the image."""
        if state.draining:
            return error(503, "the server is shutting down and takes no new jobs")
        if getattr(state.info, "is_video", False):  # (no info: a test's state that never loads a model)
            return error(400, f"this server's {state.info.pipeline_class} makes videos: use POST /v1/videos",
                         "model")
        if edit and not state.info.takes_image:
            return error(400, f"this server's {state.info.pipeline_class} makes images from text alone and takes no "
                              "image: /v1/images/edits needs an image-edit model (e.g. FLUX.1 Kontext); use "
                              "/v1/images/generations", "image")
        data = await request_fields(request, state)
        if isinstance(data, JSONResponse):
            return data
        if edit and isinstance(data, dict) and data.get("image") is None:
            state.metrics.requests.labels("rejected_invalid").inc()
            return error(400, "image: /v1/images/edits needs the image to edit (a file upload, or base64 in JSON)",
                         "image")
        job = job_or_error(state, lambda: state.make_job(ImageRequest.model_validate(data)))
        if isinstance(job, JSONResponse):
            return job
        job.pinned = pinned
        return admit(state, job) or job

    @app.post("/v1/images/generations")
    async def generations(request: Request):
        return await answer(request, edit=False)

    @app.post("/v1/images/edits")
    async def edits(request: Request):
        """OpenAI's image edit: multipart (image, prompt, n, size, response_format b64_json) or JSON, for a model
        that takes an input image."""
        return await answer(request, edit=True)

    async def answer(request: Request, edit: bool):
        """The synchronous endpoints: the job's images once it is done."""
        job = await submit(request, pinned=True, edit=edit)
        if isinstance(job, JSONResponse):
            return job
        left = asyncio.ensure_future(client_leaves(request))
        try:
            while not job.done.is_set():
                if left.done() and left.exception() is None:  # nobody waits for the images: cancel the job
                    state.queue.cancel(job)
                    if job.state == "cancelled":  # it was queued: dropped now
                        state.metrics.requests.labels("cancelled").inc()
                    return Response(status_code=499)  # nginx's "client closed request": nobody reads it
                await asyncio.sleep(0.02)
            if job.state == "done":
                return {"created": int(time.time()), "data": [{"b64_json": b64(png)} for png in job.pngs]}
        finally:  # answered (or the client left): nobody else can ask for this job's images
            left.cancel()
            state.results.release(job)
        if job.state == "cancelled":
            return error(409, f"job {job.id} was cancelled at step {job.step} of {job.steps}")
        return error(job.http_status if job.http_status >= 400 else 500, f"job {job.id} failed: {job.error}")

    @app.post("/v1/images/jobs", status_code=202)
    async def create_job(request: Request):
        job = await submit(request)
        return job if isinstance(job, JSONResponse) else JSONResponse(job.public(), status_code=202)

    def find(job_id: str) -> Job | JSONResponse:
        state.results.expire()  # a status is exact about expiry even while the rank loop is busy
        job = state.queue.get(job_id) or state.remote_job(job_id)  # another replica's (Ray Serve: serve/ray_app.py)
        if job is None or job.id.startswith("video_"):  # a video's: /v1/videos/{id}
            return error(404, f"no job {job_id!r} (unknown or forgotten)", "id")
        return job

    @app.get("/v1/images/jobs/{job_id}")
    async def job_status(job_id: str):
        job = find(job_id)
        return job if isinstance(job, JSONResponse) else job.public()

    @app.get("/v1/images/jobs/{job_id}/content")
    async def job_content(job_id: str, index: int = 0):
        job = find(job_id)
        if isinstance(job, JSONResponse):
            return job
        pngs, status = job.pngs, job.state  # in this order: a result that expires now still answers 410
        if status == "expired":
            return error(410, job.error, "id")
        if status != "done":
            return error(409, f"job {job_id} is {status}, not done: no image", "id")
        if not 0 <= index < len(pngs):
            return error(400, f"index {index}: the job has {len(pngs)} image(s)", "index")
        job.fetched.add(index)
        return Response(pngs[index], media_type="image/png")

    @app.delete("/v1/images/jobs/{job_id}")
    async def job_cancel(job_id: str):
        job = find(job_id)
        if isinstance(job, JSONResponse):
            return job
        state.cancel(job)
        if job.state == "cancelled" and job.finished and not job.started:
            state.metrics.requests.labels("cancelled").inc()
        return job.public()

    @app.get("/v1/images/jobs/{job_id}/events")
    async def job_events(job_id: str):
        """Server-sent events: the job's status each time it changes, until it ends."""
        job = find(job_id)
        if isinstance(job, JSONResponse):
            return job

        async def stream():
            last, current = None, job
            while True:
                now = current.public()
                if now != last:
                    yield f"data: {json.dumps(now)}\n\n"
                    last = now
                if current.state in TERMINAL:
                    return
                await asyncio.sleep(0.05)
                if state.queue.get(job_id) is None:  # another replica's: its latest copy (serve/ray_app.py)
                    current = state.remote_job(job_id) or current

        return StreamingResponse(stream(), media_type="text/event-stream")

    from .videos import add_video_routes

    add_video_routes(app, state)  # /v1/videos: OpenAI's video jobs (serve/videos.py)
    return app
