"""A free TCP port on the loopback interface, for the rendezvous of ranks started on this machine."""
from __future__ import annotations

import socket


def free_port() -> int:
    """A port the kernel just handed out and released: two runs started together get different ones
    (unlike a shared MASTER_PORT from the environment, which made concurrent runs kill each other)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
