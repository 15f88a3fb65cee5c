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
# Python's start-up on a loaded machine can take seconds before a rank's first beat.
STARTUP_ALLOWANCE_S = 30.0


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

    def beat(self, rank: int) -> None:
        self.last[rank] = time.monotonic()
        self.started[rank] = True

    def silent(self, ranks) -> list[tuple[int, float]]:
        """(rank, seconds silent) for the given ranks silent longer than the timeout."""
        now = time.monotonic()
        limit = [self.timeout if up else self.timeout + STARTUP_ALLOWANCE_S for up in self.started]
        return [(r, now - self.last[r]) for r in ranks if now - self.last[r] > limit[r]]
