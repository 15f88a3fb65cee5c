"""Which FP8 options a run uses (all off: meshdit computes exactly as without this package)."""
from __future__ import annotations

from dataclasses import dataclass

from ..errors import ConfigError
from ..flag_spec import flagged

ATTENTION_BACKENDS = ("sdpa", "fp8")


@dataclass(frozen=True)
class Fp8Config:
    """Each field carries its `meshdit generate` flag (docs/fp8.md: each option's measured error)."""

    gemm: bool = flagged(
        False, flag="fp8-gemm", aliases=("use_fp8_gemms", "use-fp8-gemms"), action="store_true",
        help="FP8 weights (per-output-channel scales) and per-token FP8 activations in the transformer blocks' "
             "Linear layers, through torch._scaled_mm (default: off)")
    attention: str = flagged(
        "sdpa", flag="attention-backend", choices=ATTENTION_BACKENDS,
        help="fp8: Q, K, V and probabilities in FP8 with per-block scales (a real kernel on GPUs that have one, "
             "else an emulation) (default: sdpa)")
    comm: bool = flagged(
        False, flag="fp8-comm", action="store_true",
        help="Ulysses, ring and PipeFusion traffic as FP8 with per-token scales (about half the bytes; "
             "default: off)")
    comm_k: bool = flagged(
        False, flag="fp8-comm-k", action="store_true",
        help="with --fp8-comm: Ulysses' K in FP8 too (default: off, K stays in the working dtype: K errors hit "
             "the softmax hardest)")
    stale_kv: bool = flagged(
        False, flag="fp8-stale-kv", action="store_true",
        help="PipeFusion's stale K/V buffers (every layer of a stage, the whole sequence) held in FP8 with a scale "
             "per head and token: about a quarter of float32's bytes, half of bfloat16's (default: off)")

    @property
    def enabled(self) -> bool:
        return self.gemm or self.attention != "sdpa" or self.comm or self.stale_kv

    def __bool__(self) -> bool:  # `if fp8:` reads "is any FP8 option on"
        return self.enabled

    def validate(self, pipefusion_degree: int | None = None) -> None:
        """pipefusion_degree: the run's, where known (the flags' check gives it; a bare config is checked alone)."""
        if self.attention not in ATTENTION_BACKENDS:
            raise ConfigError(f"--attention-backend must be one of {', '.join(ATTENTION_BACKENDS)}, "
                              f"got {self.attention!r}.")
        if self.comm_k and not self.comm:
            raise ConfigError("--fp8-comm-k quantizes Ulysses' K on the wire: it needs --fp8-comm too.")
        if self.stale_kv and pipefusion_degree is not None and pipefusion_degree < 2:
            raise ConfigError("--fp8-stale-kv holds PipeFusion's stale K/V in FP8, and this run has no PipeFusion: "
                              "add --pipefusion-parallel-degree 2 (or more), or drop --fp8-stale-kv.")

    def describe(self) -> str:
        parts = [name for name, on in (("fp8-gemm", self.gemm), ("fp8-attention", self.attention == "fp8"),
                                       ("fp8-comm", self.comm), ("fp8-comm-k", self.comm_k),
                                       ("fp8-stale-kv", self.stale_kv)) if on]
        return ", ".join(parts) or "off"
