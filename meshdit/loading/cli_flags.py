"""The loading flags of `meshdit generate` (declared on LoadOptions' fields), and the options they give."""
from __future__ import annotations

import argparse

from ..flags import add_settings_flags, settings_from_args
from .options import LoadOptions


def add_loading_flags(parser: argparse.ArgumentParser) -> None:
    add_settings_flags(parser, LoadOptions)


def loading_options(args) -> LoadOptions:
    return settings_from_args(LoadOptions, args)
