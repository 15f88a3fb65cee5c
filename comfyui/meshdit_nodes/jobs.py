"""A server job from submission to its result: its step progress on ComfyUI's progress bar, and a DELETE
to the server when the user interrupts the queue, so the ranks stop at the next step instead of finishing
a result nobody will see."""
from __future__ import annotations

import time
from dataclasses import dataclass

from . import comfy_hooks
from .client import Client, MeshditError

POLL_SECONDS = 0.2


@dataclass(frozen=True)
class JobApi:
    """Where a kind of job lives on the server and how its status reads."""

    create: str  # POST
    item: str  # GET (status) and DELETE (cancel), formatted with the id
    done: str  # the status of a finished job
    failed: tuple[str, ...]  # statuses that end without a result

    def progress(self, status: dict) -> tuple[int, int]:
        """(value, total) for the progress bar."""
        if "steps" in status:  # image jobs: step k of steps
            return int(status.get("step") or 0), max(1, int(status["steps"]))
        return int(status.get("progress") or 0), 100  # video jobs (OpenAI's Videos API): percent


IMAGES = JobApi("/v1/images/jobs", "/v1/images/jobs/{}", "done", ("failed", "cancelled", "expired"))
VIDEOS = JobApi("/v1/videos", "/v1/videos/{}", "completed", ("failed", "cancelled", "expired"))


def failure_message(status: dict) -> str:
    error = status.get("error")
    if isinstance(error, dict):  # OpenAI's video object: {"code", "message"}
        error = error.get("message") or error.get("code")
    return str(error or f"the job ended {status.get('status')}")


class JobRun:
    """One job: `run` submits it, follows it to its end and returns its final status."""

    def __init__(self, client: Client, api: JobApi) -> None:
        self.client, self.api = client, api
        self.id: str | None = None  # the server's job id, once submitted

    def run(self, body: dict, files: dict | None = None) -> dict:
        if comfy_hooks.interrupted():  # interrupted before it started: nothing to cancel
            comfy_hooks.raise_interrupt()
        try:
            status = self.client.json("POST", self.api.create, body, files)
        except MeshditError as exc:
            if exc.status != 404:
                raise
            raise MeshditError(f"meshdit serve at {self.client.url} has no {self.api.create} endpoint (404): update "
                               "meshdit on the server to one that serves it", 404) from None
        self.id = status["id"]
        bar = comfy_hooks.progress_bar(self.api.progress(status)[1])
        while True:
            if comfy_hooks.interrupted():
                self.cancel()
                comfy_hooks.raise_interrupt()
            value, total = self.api.progress(status)
            bar.update_absolute(value, total)
            state = status.get("status")
            if state == self.api.done:
                bar.update_absolute(total, total)
                return status
            if state in self.api.failed:
                raise MeshditError(f"meshdit serve: job {self.id} {state}: {failure_message(status)}")
            time.sleep(POLL_SECONDS)
            status = self.client.json("GET", self.api.item.format(self.id))

    def cancel(self) -> None:
        """DELETE the job; the server drops it if queued, or stops its ranks at the next step boundary."""
        try:
            self.client.json("DELETE", self.api.item.format(self.id))
        except MeshditError:  # already ended, or the server went away: nothing left to stop
            pass
