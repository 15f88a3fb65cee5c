"""The server's limits against hostile or careless clients: their flags, defaults and checks, in one place
(what a client sees at each: docs/serving.md, "Limits and hostile input")."""
from __future__ import annotations

from ..errors import ConfigError

MAX_BODY_BYTES = 1 << 20  # an image request is a few KB; a larger body is refused unread


def add_limit_flags(serve) -> None:
    serve.add_argument("--max-body-bytes", type=int, default=MAX_BODY_BYTES, metavar="BYTES",
                       help="largest request body; a larger one gets 413 without being read (default: 1 MiB)")


def check_limit_flags(args) -> None:
    if args.max_body_bytes < 1:
        raise ConfigError(f"--max-body-bytes must be >= 1, got {args.max_body_bytes}")


def limit_settings(args) -> dict:
    """ServeSettings' fields from the flags."""
    return dict(max_body_bytes=args.max_body_bytes)
