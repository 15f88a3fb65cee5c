"""Starting a real `meshdit serve` (its own ranks) as a subprocess, for the serving tests and load benchmark."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx

from ..distributed.ports import free_port

REPO = Path(__file__).resolve().parents[2]  # the checkout (PYTHONPATH for the server)
KEY = "test-key-5f1d0c"
SMALL = ["--height", "64", "--width", "64", "--steps", "4"]  # the bundled model, small and quick


class Server:
    def __init__(self, log_dir: Path, *flags: str, env: dict | None = None) -> None:
        """env: more environment for the server (e.g. phases.py's MESHDIT_FAIL_PHASE)."""
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = log_dir / f"serve-{self.port}.log"
        env = dict(os.environ, PYTHONPATH=str(REPO), MESHDIT_API_KEY=KEY, **(env or {}))
        self.proc = subprocess.Popen([sys.executable, "-m", "meshdit", "serve", "--port", str(self.port), *flags],
                                     cwd=REPO, env=env, stdout=self.log.open("w"), stderr=subprocess.STDOUT)
        self.client = httpx.Client(base_url=self.url, headers={"Authorization": f"Bearer {KEY}"}, timeout=300)

    def wait_ready(self, timeout: float = 300) -> "Server":
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"server exited {self.proc.returncode}:\n{self.log.read_text()}")
            try:
                if httpx.get(self.url + "/health", timeout=5).status_code == 200:
                    return self
            except httpx.HTTPError:
                pass
            time.sleep(0.5)
        raise TimeoutError(f"server not ready in {timeout} s:\n{self.log.read_text()}")

    def rank_pids(self) -> list[int]:
        """The spawned rank processes, rank 0 first (spawned in rank order)."""
        return sorted(pid for pid in children(self.proc.pid) if b"spawn_main" in _cmdline(pid))

    def job(self, **body) -> dict:
        r = self.client.post("/v1/images/jobs", json=body)
        assert r.status_code == 202, r.text
        return r.json()

    def wait_job(self, job_id: str, until, timeout: float = 120) -> dict:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            status = self.client.get(f"/v1/images/jobs/{job_id}").json()
            if until(status):
                return status
            time.sleep(0.05)
        raise TimeoutError(f"job {job_id}: last status {status}")

    def stop(self) -> None:
        self.client.close()
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                for pid in children(self.proc.pid):
                    os.kill(pid, signal.SIGKILL)
                self.proc.kill()
                self.proc.wait()


def children(pid: int) -> list[int]:
    out = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1]) == pid:
                    out.append(int(entry.name))
            except (OSError, IndexError, ValueError):
                pass
    return out


def _cmdline(pid: int) -> bytes:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return b""
