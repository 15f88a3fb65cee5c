"""The server's limits against hostile or careless clients: their flags, defaults and checks, in one place
(what a client sees at each: docs/serving.md, "Limits and hostile input")."""
from __future__ import annotations

from ..errors import ConfigError

MAX_BODY_BYTES = 16 << 20  # a text request is a few KB, one with an input image a few MB; larger: refused unread
RESULT_STORE_MB = 1024  # finished jobs' PNGs held on the output rank; the oldest expire first beyond it
RESULT_TTL_S = 3600.0  # a finished job's PNGs expire this long after it ended
MAX_FRAMES = 257  # frames per video request (LTX-Video's default is 161, HunyuanVideo's 129)
DRAIN_GRACE_S = 5.0  # after a SIGTERM drain, how long a job that finished during it stays fetchable
BODY_TIMEOUT_S = 30.0  # a request body not whole this long after its head: 408 (a stalled or trickling client)


def add_limit_flags(serve) -> None:
    serve.add_argument("--max-body-bytes", type=int, default=MAX_BODY_BYTES, metavar="BYTES",
                       help="largest request body (an input image travels in it); a larger one gets 413 without "
                            "being read (default: 16 MiB)")
    serve.add_argument("--body-timeout", type=float, default=BODY_TIMEOUT_S, metavar="SECONDS",
                       help="a request body must arrive whole this long after its head, else 408 "
                            f"(default: {BODY_TIMEOUT_S:g})")
    serve.add_argument("--result-store-mb", type=int, default=RESULT_STORE_MB, metavar="MIB",
                       help="memory for finished jobs' PNGs; beyond it the oldest expire (their content: 410) "
                            f"(default: {RESULT_STORE_MB})")
    serve.add_argument("--result-ttl", type=float, default=RESULT_TTL_S, metavar="SECONDS",
                       help=f"how long a finished job's PNGs stay fetchable (default: {RESULT_TTL_S:g})")
    serve.add_argument("--max-queue-seconds", type=float, default=None, metavar="SECONDS",
                       help="refuse a job with 429 and Retry-After when its predicted wait (the planner's service "
                            "time of the work ahead plus its own, corrected by measured times) exceeds this "
                            "(default: no limit; --max-queue still caps the count)")
    serve.add_argument("--max-frames", type=int, default=MAX_FRAMES, metavar="N",
                       help=f"video models: most frames one request may ask for (`seconds` x fps, or `num_frames`); "
                            f"more get 400 (default: {MAX_FRAMES})")
    serve.add_argument("--drain-grace", type=float, default=DRAIN_GRACE_S, metavar="SECONDS",
                       help="on SIGTERM / Ctrl-C, how long the images of jobs that finished during the drain stay "
                            f"fetchable before exit, unless fetched sooner (default: {DRAIN_GRACE_S:g})")


def check_limit_flags(args) -> None:
    if args.max_body_bytes < 1:
        raise ConfigError(f"--max-body-bytes must be >= 1, got {args.max_body_bytes}")
    if not args.body_timeout > 0:
        raise ConfigError(f"--body-timeout must be > 0 seconds, got {args.body_timeout:g}")
    if args.result_store_mb < 1:
        raise ConfigError(f"--result-store-mb must be >= 1 (MiB), got {args.result_store_mb}")
    if args.result_ttl <= 0:
        raise ConfigError(f"--result-ttl must be > 0 seconds, got {args.result_ttl:g}")
    if args.max_queue_seconds is not None and not args.max_queue_seconds > 0:
        raise ConfigError(f"--max-queue-seconds must be > 0 seconds, got {args.max_queue_seconds:g}")
    if args.max_frames < 1:
        raise ConfigError(f"--max-frames must be >= 1, got {args.max_frames}")
    if args.drain_grace < 0:
        raise ConfigError(f"--drain-grace must be >= 0 seconds, got {args.drain_grace:g}")


def limit_settings(args) -> dict:
    """ServeSettings' fields from the flags."""
    return dict(max_body_bytes=args.max_body_bytes, body_timeout=args.body_timeout,
                result_store_bytes=args.result_store_mb << 20, result_ttl=args.result_ttl,
                drain_grace=args.drain_grace, max_frames=args.max_frames, max_queue_seconds=args.max_queue_seconds)
