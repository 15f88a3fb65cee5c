"""Where a rank is in its run, for tests that interrupt or kill it at a known phase.

`reached(phase)` marks the start of a phase (runner.py: loading; engine.py: decoding). With
MESHDIT_HOLD_PHASE=PHASE (tests only) every rank reaching that phase says so on stderr and stays
there, sleeping in Python as a rank busy in Python code would, so a test can signal it there;
unset, `reached` costs one environment lookup. The other phases need no hold: start-up (the
ranks' imports) and compiling (`--compile`'s first step) are slow by themselves, denoising is as
long as its steps.

MESHDIT_FAIL_PHASE=PHASE[@RANK] (tests only) makes every rank (or rank RANK alone) raise `InjectedFault` the first
time it reaches PHASE: an error in one request on every rank, or on one rank only, as a model's own bug would raise
(serve's agreement on a failed request: tests/serve/test_faults.py).
"""
from __future__ import annotations

import os
import sys
import time

PHASES = ("start-up", "loading", "compiling", "denoising", "decoding")
HOLD_S = 600.0


class InjectedFault(RuntimeError):
    """What MESHDIT_FAIL_PHASE raises."""


_failed: set = set()


def reached(phase: str) -> None:
    """This rank starts `phase`; holds here when MESHDIT_HOLD_PHASE names it. PHASE:native holds inside
    long native calls instead (8192 x 8192 matrix products: seconds each), which Python cannot interrupt,
    as a huge request's attention call would be."""
    fail, _, rank = os.environ.get("MESHDIT_FAIL_PHASE", "").partition("@")
    if fail == phase and phase not in _failed and rank in ("", os.environ.get("RANK", "0")):
        _failed.add(phase)
        raise InjectedFault(f"MESHDIT_FAIL_PHASE={os.environ['MESHDIT_FAIL_PHASE']}: rank "
                            f"{os.environ.get('RANK', '0')} failed in phase {phase}")
    hold, _, how = os.environ.get("MESHDIT_HOLD_PHASE", "").partition(":")
    if hold != phase:
        return
    print(f"meshdit: rank {os.environ.get('RANK', '0')} holding in phase {phase} (MESHDIT_HOLD_PHASE)",
          file=sys.stderr, flush=True)
    deadline = time.monotonic() + HOLD_S
    if how == "native":
        import torch

        a = torch.ones(8192, 8192)
        while time.monotonic() < deadline:
            torch.mm(a, a)
    while time.monotonic() < deadline:
        time.sleep(0.05)
