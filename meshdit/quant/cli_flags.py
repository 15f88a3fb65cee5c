"""`meshdit generate` flags for FP8, kept here so the CLI needs two lines for them."""
from __future__ import annotations

import argparse

from .settings import ATTENTION_BACKENDS, Fp8Config


def add_fp8_flags(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("FP8 (README \"FP8\": each option's measured error)")
    group.add_argument("--fp8-gemm", "--fp8_gemm", "--use_fp8_gemms", "--use-fp8-gemms", dest="fp8_gemm",
                       action="store_true",
                       help="FP8 weights (per-output-channel scales) and per-token FP8 activations in the "
                            "transformer blocks' Linear layers, through torch._scaled_mm (default: off)")
    group.add_argument("--attention-backend", "--attention_backend", dest="attention_backend",
                       choices=ATTENTION_BACKENDS, default="sdpa",
                       help="fp8: Q, K, V and probabilities in FP8 with per-block scales (a real kernel on GPUs "
                            "that have one, else an emulation) (default: sdpa)")
    group.add_argument("--fp8-comm", "--fp8_comm", dest="fp8_comm", action="store_true",
                       help="Ulysses, ring and PipeFusion traffic as FP8 with per-token scales (about half the bytes; "
                            "default: off)")
    group.add_argument("--fp8-comm-k", "--fp8_comm_k", dest="fp8_comm_k", action="store_true",
                       help="with --fp8-comm: Ulysses' K in FP8 too (default: off, K stays in the working dtype)")


def fp8_config_from_args(args) -> Fp8Config | None:
    """The Fp8Config the flags ask for (None: all off), checked before any rank starts."""
    fp8 = Fp8Config(gemm=args.fp8_gemm, attention=args.attention_backend, comm=args.fp8_comm,
                    comm_k=args.fp8_comm_k)
    fp8.validate()
    if fp8.gemm:
        from ..distributed.mesh import pick_device
        from .formats import check_fp8_gemm

        check_fp8_gemm(pick_device())
    return fp8 if fp8.enabled else None
