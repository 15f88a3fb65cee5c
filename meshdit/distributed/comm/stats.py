"""The byte counters: what this rank puts on the wire, per kind of message (for benchmarks and tests).

Only the primitives of this package call `comm_stats.add`, one rule per primitive:
- point to point (pipeline, ring, halos, loading sends): the bytes sent;
- all-to-all: the bytes sent to the other ranks;
- all-gather: this rank's (padded) part times (ranks - 1);
- all-reduce (tensor_parallel_all_reduce too): 2 (ranks - 1) / ranks times the tensor's bytes (what a ring
  all-reduce sends);
- broadcast: on the source, the bytes times (ranks - 1); 0 elsewhere.
Nothing is counted on a group of one rank, where nothing travels.
"""
from __future__ import annotations

from collections import defaultdict


class CommStats:
    """Bytes this rank sent, per kind of message.

    bf16_bytes counts what the same payloads would have cost in bfloat16, so an
    FP8 run reports its saving against the usual GPU working dtype.
    """

    def __init__(self) -> None:
        self.bytes_sent: dict[str, int] = defaultdict(int)
        self.bf16_bytes: dict[str, int] = defaultdict(int)

    def add(self, kind: str, nbytes: int, numel: int | None = None) -> None:
        self.bytes_sent[kind] += int(nbytes)
        if numel is not None:
            self.bf16_bytes[kind] += 2 * int(numel)

    def reset(self) -> None:
        self.bytes_sent.clear()
        self.bf16_bytes.clear()


comm_stats = CommStats()
