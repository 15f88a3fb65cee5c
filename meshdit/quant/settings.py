"""Which FP8 options a run uses (all off: meshdit computes exactly as without this package)."""
from __future__ import annotations

from dataclasses import dataclass

from ..errors import ConfigError

ATTENTION_BACKENDS = ("sdpa", "fp8")


@dataclass(frozen=True)
class Fp8Config:
    gemm: bool = False
    """Linear layers of the transformer's block lists hold FP8 weights; activations are quantized per token."""
    attention: str = "sdpa"
    """"fp8": Q, K, V and the probabilities quantized to FP8 with per-block scales."""
    comm: bool = False
    """Ulysses, ring and PipeFusion payloads travel as FP8 with per-token scales."""
    comm_k: bool = False
    """With comm: also Ulysses' K (kept in the working dtype by default: K errors hit the softmax hardest)."""

    @property
    def enabled(self) -> bool:
        return self.gemm or self.attention != "sdpa" or self.comm

    def __bool__(self) -> bool:  # `if fp8:` reads "is any FP8 option on"
        return self.enabled

    def validate(self) -> None:
        if self.attention not in ATTENTION_BACKENDS:
            raise ConfigError(f"--attention-backend must be one of {', '.join(ATTENTION_BACKENDS)}, "
                              f"got {self.attention!r}.")
        if self.comm_k and not self.comm:
            raise ConfigError("--fp8-comm-k quantizes Ulysses' K on the wire: it needs --fp8-comm too.")

    def describe(self) -> str:
        parts = [name for name, on in (("fp8-gemm", self.gemm), ("fp8-attention", self.attention == "fp8"),
                                       ("fp8-comm", self.comm), ("fp8-comm-k", self.comm_k)) if on]
        return ", ".join(parts) or "off"
