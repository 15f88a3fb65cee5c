"""The FP8 flags of `meshdit generate` and `meshdit serve` (declared on Fp8Config's fields); flags.
engine_settings_from_args reads them, prelaunch.check_before_launch checks them."""
from __future__ import annotations

import argparse

from ..flags import add_settings_flags
from .settings import Fp8Config


def add_fp8_flags(parser: argparse.ArgumentParser) -> None:
    add_settings_flags(parser.add_argument_group("FP8 (docs/fp8.md: each option's measured error)"), Fp8Config)
