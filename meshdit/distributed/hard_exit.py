"""Leaving a rank process without interpreter teardown, and without leaving files behind."""
from __future__ import annotations

import multiprocessing.util
import os
from typing import NoReturn


def hard_exit(code: int) -> NoReturn:
    """os._exit(code) after multiprocessing's exit finalizers, which os._exit would skip.

    Rank processes end with os._exit because gloo can hang or abort in interpreter teardown. The
    finalizers it skips remove multiprocessing's pymp-* temp folder (made in a process once a tensor
    or file descriptor went through a Pipe) and stop its fd-sharing listener. Only the multiprocessing
    finalizers run here, not atexit handlers (torch.distributed's among them)."""
    try:
        multiprocessing.util._run_finalizers()  # what multiprocessing's own exit function runs; not public
    finally:
        os._exit(code)
