"""Heartbeats: each spawned rank says "alive" every few seconds over its pipe to the launcher.

A rank that stops (SIGSTOP, a frozen host thread, a debugger) stops beating; the launcher
names it once it has been silent for MESHDIT_HEARTBEAT_TIMEOUT seconds (default 20), instead
of waiting for the collective timeout, which blames whichever rank timed out first.
The beat comes from a daemon thread, so a rank busy in a long op (which releases the GIL)
still beats; a rank whose launcher died finds its pipe broken and exits, leaving nothing behind.
"""
from __future__ import annotations

import os
import threading
import time

DEFAULT_TIMEOUT_S = 20.0
# Until a rank has joined the world (init_distributed), the limit is longer by this much: start-up
# (Python, then importing torch and diffusers, which can hold the GIL for seconds and so delay beats)
# takes tens of seconds on a loaded machine.
STARTUP_ALLOWANCE_S = 60.0

_LINK: "RankLink | None" = None   # this process's link to its launcher, when spawned by launch.py


def joined_world() -> None:
    """Called once this rank has joined the process group: the strict heartbeat limit applies from now."""
    if _LINK is not None:
        _LINK.send(("joined",))


def heartbeat_timeout() -> float:
    """Seconds of silence after which a rank counts as frozen (env MESHDIT_HEARTBEAT_TIMEOUT)."""
    text = os.environ.get("MESHDIT_HEARTBEAT_TIMEOUT", "")
    try:
        value = float(text) if text else DEFAULT_TIMEOUT_S
    except ValueError:
        value = DEFAULT_TIMEOUT_S
    return value if value > 0 else DEFAULT_TIMEOUT_S


class RankLink:
    """The rank's end of its pipe: thread-safe sends, and the heartbeat thread."""

    def __init__(self, conn, timeout: float) -> None:
        self.conn = conn
        self._lock = threading.Lock()
        self._interval = max(0.05, timeout / 5)
        self._stopped = threading.Event()

    def send(self, message: tuple) -> bool:
        """False when the launcher is gone."""
        with self._lock:
            try:
                self.conn.send(message)
                return True
            except (BrokenPipeError, EOFError, OSError):
                return False

    def start_heartbeat(self) -> None:
        global _LINK
        _LINK = self
        threading.Thread(target=self._beat, name="meshdit-heartbeat", daemon=True).start()

    def stop_heartbeat(self) -> None:
        self._stopped.set()

    def _beat(self) -> None:
        while not self._stopped.is_set():
            if not self.send(("beat",)):
                os._exit(1)  # the launcher died (SIGKILL): do not linger as an orphan
            self._stopped.wait(self._interval)


class HeartbeatWatch:
    """The launcher's side: the last beat of each rank, and which have gone silent."""

    def __init__(self, world_size: int, timeout: float) -> None:
        now = time.monotonic()
        self.timeout = timeout
        self.last = [now] * world_size
        self.started = [False] * world_size

    def beat(self, rank: int, joined: bool = False) -> None:
        self.last[rank] = time.monotonic()
        self.started[rank] = self.started[rank] or joined

    def silent(self, ranks) -> list[tuple[int, float]]:
        """(rank, seconds silent) for the given ranks silent longer than the timeout."""
        now = time.monotonic()
        limit = [self.timeout if up else self.timeout + STARTUP_ALLOWANCE_S for up in self.started]
        return [(r, now - self.last[r]) for r in ranks if now - self.last[r] > limit[r]]
