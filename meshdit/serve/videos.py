"""OpenAI's video endpoints over the same jobs as images: POST /v1/videos (a job), GET /v1/videos/{id} (its status
and progress), GET /v1/videos/{id}/content (the MP4), DELETE /v1/videos/{id}, GET /v1/videos (the list).

A video job is an image job whose request has frames and whose result is the MP4 `meshdit generate --output
clip.mp4` writes (output.video_file_bytes): the same queue, batching, limits, auth, cancel, result store and
metrics. OpenAI's statuses are queued / in_progress / completed / failed; a cancelled job is "failed" with the
error code "cancelled". No family meshdit runs makes audio, so the MP4 has none.
"""
from __future__ import annotations

import math
import uuid

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response

from .app import TEXT_FIELDS, admit, error, job_or_error, request_fields
from .jobs import Job
from .schemas import VideoRequest
from .server_state import BadRequest, ServerState

VIDEO_TEXT_FIELDS = TEXT_FIELDS | {"seconds"}  # OpenAI's client sends seconds as text ("4")
STATUS = {"queued": "queued", "running": "in_progress", "done": "completed", "expired": "completed",
          "failed": "failed", "cancelled": "failed"}
"""A job's state -> OpenAI's video status (an expired job completed; its content answers 410)."""


def frames_for(info, seconds: float, fps: int) -> int:
    """The fewest frames this model's VAE (k * temporal factor + 1) and temporal patch take that play for at
    least `seconds` at `fps`."""
    factor, patch = info.vae_temporal_factor, info.family.temporal_patch(info.transformer_config)
    frames = max(1, math.ceil(seconds * fps - 1e-9))
    latent = math.ceil((frames - 1) / factor) + 1
    latent = math.ceil(latent / patch) * patch
    return (latent - 1) * factor + 1


def _seconds(value) -> float:
    try:
        seconds = float(value)
    except ValueError:
        raise BadRequest("seconds", f"seconds: {value!r} is not a number of seconds (e.g. \"4\")") from None
    if not math.isfinite(seconds) or seconds <= 0:
        raise BadRequest("seconds", f"seconds must be > 0, got {value!r}")
    return seconds


def _reference(body: VideoRequest) -> str | None:
    """input_reference as the base64 (or data: URL) text make_job's `image` takes."""
    ref = body.input_reference
    if ref is None or isinstance(ref, str):
        return ref
    if ref.file_id is not None or ref.image_url is None:
        raise BadRequest("input_reference", "input_reference: a file_id cannot be resolved by this server: send "
                                            "the image as a file upload, base64, or {\"image_url\": \"data:...\"}")
    if not ref.image_url.startswith("data:"):
        raise BadRequest("input_reference", "input_reference.image_url: this server fetches no URL: send the image "
                                            "as a data: URL (data:image/png;base64,...) or upload the file")
    return ref.image_url


def make_video_job(state: ServerState, body: VideoRequest) -> Job:
    """The job of one video request, resolved against the model and layout as an image request is
    (ServerState.make_job, with the clip's length, fps and first frame; BadRequest naming the field)."""
    info, settings = state.info, state.settings
    if body.num_frames is not None and body.seconds is not None:
        raise BadRequest("num_frames", "num_frames and seconds both set the clip's length: send one")
    length_param = "num_frames" if body.num_frames is not None else "seconds"
    fps = body.fps
    frames = body.num_frames
    if body.seconds is not None:
        fps = fps or state.resolved_defaults().fps
        frames = frames_for(info, _seconds(body.seconds), fps)
    if frames is not None and frames > settings.max_frames:
        raise BadRequest(length_param, f"{length_param}: {frames} frames is more than this server's limit of "
                                       f"{settings.max_frames} (--max-frames)")
    image = _reference(body)
    if image is not None and not info.takes_image:
        raise BadRequest("input_reference", f"input_reference: this {info.pipeline_class} makes videos from text "
                                            "alone and takes no image: drop input_reference (or serve the family's "
                                            "image-to-video model)")
    if image is None and info.needs_image:
        raise BadRequest("input_reference", f"input_reference: this {info.pipeline_class} animates an image: send "
                                            "its first frame")
    video = {"num_frames": frames, "fps": fps, "image": image}
    try:
        job = state.make_job(body, {k: v for k, v in video.items() if v is not None or k == "image"},
                             {"num_frames": length_param, "image": "input_reference"})
    except BadRequest as exc:
        if exc.param != "image":  # ServerState._image's own refusals of the file
            raise
        raise BadRequest("input_reference", exc.message.replace("image:", "input_reference:", 1)) from None
    if job.request.num_frames > settings.max_frames:  # the server's default length
        raise BadRequest(length_param, f"{length_param}: {job.request.num_frames} frames is more than this "
                                       f"server's limit of {settings.max_frames} (--max-frames)")
    job.id = "video_" + uuid.uuid4().hex[:24]
    return job


def video_object(state: ServerState, job: Job) -> dict:
    """The job as OpenAI's Video object, with meshdit's step, steps, num_frames and fps."""
    r = job.request
    running = job.state == "running"
    progress = 100 if job.state in ("done", "expired") else min(99, 100 * job.step // max(job.steps, 1)) \
        if running or job.step else 0
    out = {"id": job.id, "object": "video", "model": state.model_id, "status": STATUS[job.state],
           "progress": progress, "created_at": int(job.created), "completed_at": None, "expires_at": None,
           "prompt": r.prompts[0], "seconds": f"{r.num_frames / r.fps:g}", "size": f"{r.width}x{r.height}",
           "error": None, "step": job.step, "steps": job.steps, "num_frames": r.num_frames, "fps": r.fps}
    if job.finished is not None and job.state != "running":
        out["completed_at"] = int(job.finished)
    if job.state == "done":
        out["expires_at"] = int(job.finished + state.settings.result_ttl)
    if job.state in ("failed", "cancelled", "expired"):
        code = {"cancelled": "cancelled", "expired": "expired"}.get(job.state, "failed")
        message = job.error or f"cancelled at step {job.step} of {job.steps}"
        out["error"] = {"code": code, "message": message}
    return out


def add_video_routes(app: FastAPI, state: ServerState) -> None:
    def find(video_id: str) -> Job | JSONResponse:
        state.results.expire()
        job = state.queue.get(video_id) or state.remote_job(video_id)  # another replica's (serve/ray_app.py)
        if job is None or not job.id.startswith("video_"):
            return error(404, f"no video {video_id!r} (unknown, deleted or forgotten)", "id")
        return job

    @app.post("/v1/videos")
    async def create(request: Request):
        if state.draining:
            return error(503, "the server is shutting down and takes no new jobs")
        if not getattr(state.info, "is_video", False):
            return error(400, f"this server's {state.info.pipeline_class} makes images: use "
                              "/v1/images/generations", "model")
        data = await request_fields(request, state, "input_reference", VIDEO_TEXT_FIELDS)
        if isinstance(data, JSONResponse):
            return data
        if isinstance(data, dict) and "input_reference[image_url]" in data:  # the reference object as form fields
            data["input_reference"] = {"image_url": data.pop("input_reference[image_url]")}
        job = job_or_error(state, lambda: make_video_job(state, VideoRequest.model_validate(data)))
        if isinstance(job, JSONResponse):
            return job
        return admit(state, job) or video_object(state, job)

    @app.get("/v1/videos")
    async def listing(limit: int = 20, order: str = "desc"):
        jobs = sorted((j for j in list(state.queue.jobs.values()) if j.id.startswith("video_")),
                      key=lambda j: j.created, reverse=order != "asc")[:max(1, min(limit, 100))]
        data = [video_object(state, job) for job in jobs]
        return {"object": "list", "data": data, "first_id": data[0]["id"] if data else None,
                "last_id": data[-1]["id"] if data else None, "has_more": False}

    @app.get("/v1/videos/{video_id}")
    async def retrieve(video_id: str):
        job = find(video_id)
        return job if isinstance(job, JSONResponse) else video_object(state, job)

    @app.get("/v1/videos/{video_id}/content")
    async def content(video_id: str, variant: str = "video"):
        job = find(video_id)
        if isinstance(job, JSONResponse):
            return job
        if variant != "video":
            return error(400, f"variant {variant!r}: this server makes the video only (variant=video)", "variant")
        files, status = job.pngs, job.state  # in this order: a result that expires now still answers 410
        if status == "expired":
            return error(410, job.error, "id")
        if status != "done":
            return error(409, f"video {video_id} is {STATUS[status]}, not completed: no content yet", "id")
        job.fetched.add(0)
        return Response(files[0], media_type="video/mp4",
                        headers={"Content-Disposition": f'inline; filename="{video_id}.mp4"'})

    @app.delete("/v1/videos/{video_id}")
    async def delete(video_id: str):
        """Cancels a queued or running job (a running one stops at the next step boundary), drops its video, and
        forgets it: its id answers 404 from now on."""
        job = find(video_id)
        if isinstance(job, JSONResponse):
            return job
        was_queued = job.state == "queued"
        state.queue.forget(job)
        state.results.release(job)
        if was_queued:
            state.metrics.requests.labels("cancelled").inc()
        return {"id": job.id, "object": "video.deleted", "deleted": True}
