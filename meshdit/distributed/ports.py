"""A free TCP port on the loopback interface, for the rendezvous of ranks started on this machine."""
from __future__ import annotations

import random
import socket

_FALLBACK_EPHEMERAL_START = 32768  # Linux's default ip_local_port_range start


def free_port() -> int:
    """A port that is free now, drawn at random below the kernel's ephemeral range.

    Rank 0 binds it seconds later (after importing torch). A port from the ephemeral range
    could meanwhile be handed to any outgoing connection (gloo opens many), which made
    concurrent runs fail with EADDRINUSE; below that range only another server's bind can
    take it. Random, so two runs started together get different ones (unlike a shared
    MASTER_PORT from the environment, which made concurrent runs join each other).
    """
    low = _ephemeral_start()
    for _ in range(200):
        port = random.randint(max(1024, low // 2), low - 1)
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    with socket.socket() as s:  # everything below the range is taken: let the kernel choose
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _ephemeral_start() -> int:
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            return int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        return _FALLBACK_EPHEMERAL_START
