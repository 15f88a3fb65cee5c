"""`meshdit generate` flags for FP8 (declared on Fp8Config's fields), and the config they give."""
from __future__ import annotations

import argparse

from ..flags import add_settings_flags, settings_from_args
from .settings import Fp8Config


def add_fp8_flags(parser: argparse.ArgumentParser) -> None:
    add_settings_flags(parser.add_argument_group("FP8 (docs/fp8.md: each option's measured error)"), Fp8Config)


def fp8_config_from_args(args, pipefusion_degree: int | None = None) -> Fp8Config | None:
    """The Fp8Config the flags ask for (None: all off), checked before any rank starts (with the run's
    PipeFusion degree where the caller knows it)."""
    fp8 = settings_from_args(Fp8Config, args)
    fp8.validate(pipefusion_degree)
    if fp8.gemm:
        from ..distributed.mesh import pick_device
        from .formats import check_fp8_gemm

        check_fp8_gemm(pick_device())
    return fp8 if fp8.enabled else None
