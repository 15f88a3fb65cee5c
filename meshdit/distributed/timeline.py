"""A per-rank timeline of messages: spans recorded around the communication primitives, only while on.

`timeline.record()` turns recording on for a block of code and returns the spans list; outside it
each `span()` costs one attribute check. Times are `time.perf_counter()` seconds (CLOCK_MONOTONIC,
one clock for every process of a machine), so spans of different ranks can be lined up:
benchmarks/timeline.py tells waiting from communicating by matching them across ranks.
"""
from __future__ import annotations

import time
from contextlib import contextmanager
from dataclasses import dataclass


@dataclass(frozen=True)
class Span:
    kind: str  # "all_to_all", "all_gather", "broadcast", "ring_post", "ring_wait", "send_post", "recv", "send_wait"
    start: float
    end: float
    peer: int | None = None  # the other global rank of a point-to-point message (None: a collective)


class Timeline:
    def __init__(self) -> None:
        self.spans: list[Span] | None = None  # None: not recording

    @contextmanager
    def record(self):
        """Records the spans of everything sent or waited for inside the block into the yielded list."""
        self.spans = spans = []
        try:
            yield spans
        finally:
            self.spans = None

    @contextmanager
    def span(self, kind: str, peer: int | None = None):
        if self.spans is None:
            yield
            return
        start = time.perf_counter()
        try:
            yield
        finally:
            self.spans.append(Span(kind, start, time.perf_counter(), peer))


timeline = Timeline()
