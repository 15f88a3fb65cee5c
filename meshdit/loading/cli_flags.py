"""The loading flags of `meshdit generate`, declared in one place."""
from __future__ import annotations

import argparse


def add_loading_flags(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--memory-efficient-load", "--memory_efficient_load", "--memory_efficient_replicated_load",
        dest="memory_efficient_load", action=argparse.BooleanOptionalAction, default=None,
        help="one copy of the weights in host memory however many ranks (default: on for multi-rank runs)")
    parser.add_argument(
        "--text-encoder-device", "--text_encoder_device", dest="text_encoder_device", choices=["cpu"],
        default=None, help="keep the text encoders on the CPU (default: the rank's device)")


def loading_options(args):
    from .options import LoadOptions

    return LoadOptions(memory_efficient=args.memory_efficient_load, text_encoder_device=args.text_encoder_device)
