"""The loading flags of `meshdit generate` and `meshdit serve` (declared on LoadOptions' fields); flags.
engine_settings_from_args reads them."""
from __future__ import annotations

import argparse

from ..flags import add_settings_flags
from .options import LoadOptions


def add_loading_flags(parser: argparse.ArgumentParser) -> None:
    add_settings_flags(parser, LoadOptions)
