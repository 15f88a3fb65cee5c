"""HTTP to `meshdit serve` with the standard library only (urllib), so the pack needs no install in ComfyUI.

Every failure becomes a MeshditError whose text is what a person can act on: the server's own message
(OpenAI's error shape, `{"error": {"message": ...}}`) for an answer with an error status, or what to check
when no server answers at the URL."""
from __future__ import annotations

import json
import urllib.error
import urllib.request
import uuid

DEFAULT_URL = "http://127.0.0.1:8000"


class MeshditError(RuntimeError):
    """What the server (or the connection to it) said went wrong; ComfyUI shows the text on the node."""

    def __init__(self, message: str, status: int | None = None) -> None:
        super().__init__(message)
        self.status = status


def server_message(status: int, raw: bytes) -> str:
    """The server's message from an error answer: OpenAI's `error.message`, else the body's text."""
    try:
        body = json.loads(raw)
        message = body["error"]["message"] if isinstance(body.get("error"), dict) else body.get("detail")
    except (ValueError, AttributeError, KeyError, TypeError):
        message = None
    return str(message) if message else (raw.decode("utf-8", "replace").strip() or f"HTTP {status}")


def multipart(fields: dict, files: dict) -> tuple[bytes, str]:
    """multipart/form-data: `fields` as text (dicts and lists as JSON), `files` {name: (filename, bytes, type)}.
    Returns (body, content type)."""
    boundary = "meshdit-" + uuid.uuid4().hex
    parts = []
    for name, value in fields.items():
        text = value if isinstance(value, str) else json.dumps(value)
        parts.append(f'--{boundary}\r\nContent-Disposition: form-data; name="{name}"\r\n\r\n{text}\r\n'.encode())
    for name, (filename, data, content_type) in files.items():
        head = (f'--{boundary}\r\nContent-Disposition: form-data; name="{name}"; filename="{filename}"\r\n'
                f"Content-Type: {content_type}\r\n\r\n").encode()
        parts.append(head + data + b"\r\n")
    parts.append(f"--{boundary}--\r\n".encode())
    return b"".join(parts), f"multipart/form-data; boundary={boundary}"


class Client:
    """One server: its URL and API key (empty: none sent)."""

    def __init__(self, url: str = DEFAULT_URL, api_key: str = "", timeout: float = 60.0) -> None:
        url = (url or DEFAULT_URL).strip().rstrip("/")
        if url.endswith("/v1"):  # the openai client's base_url spelling
            url = url[:-3]
        if not url.startswith(("http://", "https://")):
            raise MeshditError(f"server URL {url!r}: give it as http://HOST:PORT (e.g. {DEFAULT_URL})")
        self.url, self.api_key, self.timeout = url, api_key.strip(), timeout

    def call(self, method: str, path: str, body=None, files: dict | None = None) -> tuple[bytes, str]:
        """(answer body, content type); JSON `body`, or multipart when `files` are given."""
        headers = {"Accept": "application/json"}
        if self.api_key:
            headers["Authorization"] = f"Bearer {self.api_key}"
        data = None
        if files:
            data, headers["Content-Type"] = multipart(body or {}, files)
        elif body is not None:
            data, headers["Content-Type"] = json.dumps(body).encode(), "application/json"
        request = urllib.request.Request(self.url + path, data=data, method=method, headers=headers)
        try:
            with urllib.request.urlopen(request, timeout=self.timeout) as answer:
                return answer.read(), answer.headers.get("Content-Type", "")
        except urllib.error.HTTPError as exc:
            raw = exc.read()
            raise MeshditError(f"meshdit serve ({exc.code}): {server_message(exc.code, raw)}", exc.code) from None
        except (urllib.error.URLError, OSError) as exc:
            reason = getattr(exc, "reason", exc)
            raise MeshditError(f"no meshdit server answers at {self.url} ({reason}): start one with `meshdit serve "
                               "--port PORT` or fix the server URL in the meshdit Settings node") from None

    def json(self, method: str, path: str, body=None, files: dict | None = None) -> dict:
        raw, _ = self.call(method, path, body, files)
        try:
            return json.loads(raw)
        except ValueError:
            raise MeshditError(f"{self.url}{path} answered something other than JSON: is this a meshdit "
                               "server?") from None

    def model_ids(self) -> tuple[str, list[str]]:
        """(the served model, the LoRA adapters requests may name), from /v1/models."""
        data = self.json("GET", "/v1/models")["data"]
        models = [m["id"] for m in data if m.get("type") != "lora"]
        return (models[0] if models else ""), [m["id"] for m in data if m.get("type") == "lora"]
