"""What the user asked of loading (flags or Python), and what it means on a given layout."""
from __future__ import annotations

from dataclasses import dataclass

TRANSPORTS = ("auto", "shared", "broadcast")


@dataclass
class LoadOptions:
    memory_efficient: bool | None = None  # None: on for multi-rank runs, off for one rank
    text_encoder_device: str | None = None  # None: the rank's device; "cpu" keeps text encoders on the CPU
    # How the weights reach the ranks. "shared": every CPU rank maps the same read-only file pages
    # (one copy in host memory); "broadcast": rank 0 reads tensor by tensor and sends each to the
    # ranks that need it (GPU ranks). "auto": shared on CPU, broadcast otherwise.
    transport: str = "auto"

    def efficient(self, world_size: int) -> bool:
        return world_size > 1 if self.memory_efficient is None else self.memory_efficient

    def transport_for(self, device_type: str) -> str:
        if self.transport not in TRANSPORTS:
            raise ValueError(f"transport must be one of {TRANSPORTS}, got {self.transport!r}")
        if self.transport != "auto":
            return self.transport
        return "shared" if device_type == "cpu" else "broadcast"
