"""What the user asked of loading (flags or Python), and what it means on a given layout."""
from __future__ import annotations

import argparse
from dataclasses import dataclass

from ..errors import ConfigError
from ..flag_spec import flagged

TRANSPORTS = ("auto", "shared", "broadcast")


@dataclass
class LoadOptions:
    memory_efficient: bool | None = flagged(
        None, flag="memory-efficient-load", aliases=("memory_efficient_replicated_load",),
        action=argparse.BooleanOptionalAction,
        help="one copy of the weights in host memory however many ranks (default: on for multi-rank runs)")
    text_encoder_device: str | None = flagged(
        None, flag="text-encoder-device", choices=["cpu"],
        help="keep the text encoders on the CPU (default: the rank's device)")
    offload: str | None = flagged(
        None, flag="offload", choices=["blocks"],
        help="blocks: keep the transformer blocks' weights in host memory and copy each to the device just before "
             "it runs, the next one prefetched meanwhile (default: off; docs/loading.md)")
    text_encoder_parallel: bool = flagged(
        False, flag="text-encoder-parallel", action="store_true",
        help="split every text encoder's layers over the ranks, each holding one contiguous run of them, instead of "
             "encoding on one rank that holds them all (default: off; docs/loading.md)")
    # How the weights reach the ranks. "shared": every CPU rank maps the same read-only file pages
    # (one copy in host memory); "broadcast": rank 0 reads tensor by tensor and sends each to the
    # ranks that need it (GPU ranks). "auto": shared on CPU, broadcast otherwise.
    transport: str = "auto"

    def validate(self, world_size: int) -> None:
        """ConfigError naming the flag (EngineSettings.validate)."""
        if self.text_encoder_parallel and world_size == 1:
            raise ConfigError("--text-encoder-parallel splits the text encoders over the ranks, but this run has one "
                              "rank: drop it, or run on more ranks.")
        if self.text_encoder_parallel and self.text_encoder_device:
            raise ConfigError("--text-encoder-parallel with --text-encoder-device: the first splits the encoders over "
                              "the ranks' devices, the second keeps them whole on the CPU; drop one of them.")

    def efficient(self, world_size: int) -> bool:
        return world_size > 1 if self.memory_efficient is None else self.memory_efficient

    def transport_for(self, device_type: str) -> str:
        if self.transport not in TRANSPORTS:
            raise ValueError(f"transport must be one of {TRANSPORTS}, got {self.transport!r}")
        if self.transport != "auto":
            return self.transport
        return "shared" if device_type == "cpu" else "broadcast"
