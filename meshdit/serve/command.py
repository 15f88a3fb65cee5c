"""`meshdit serve`: its flags (the model and layout flags are generate's own) and the checks before any rank starts."""
from __future__ import annotations

import argparse
import os
import socket

from ..config import GenerateRequest, ParallelConfig
from ..errors import ConfigError
from ..flag_spec import flag_specs
from ..vae.settings import VaeDecodeSettings
from .limits import add_limit_flags, check_limit_flags, limit_settings

# generate's flags that serve shares: model, every layout and VAE flag, and the request defaults (PipeFusion's
# warmup steps, patches and drift correction are server-wide: every request gets them)
SHARED = ("model", "dtype", "verbose", "height", "width", "steps", "guidance_scale", "max_sequence_length",
          "warmup_steps", "num_pipeline_patch", "no_kv_drift_correction") + tuple(
    spec.dest for settings in (ParallelConfig, VaeDecodeSettings) for _, spec in flag_specs(settings))


def add_serve_parser(commands, generate_parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    serve = commands.add_parser("serve", help="serve an OpenAI-compatible image API over the mesh")
    for action in generate_parser._actions:
        if action.dest in SHARED and action.option_strings:
            serve._add_action(action)
    serve.add_argument("--host", default="127.0.0.1")
    serve.add_argument("--port", type=int, default=8000)
    serve.add_argument("--api-key", default=None,
                       help="require 'Authorization: Bearer KEY' (default: env MESHDIT_API_KEY; unset: no key)")
    serve.add_argument("--max-queue", type=int, default=16, help="jobs that may wait; more get 429")
    serve.add_argument("--no-batching", action="store_true", help="run one request at a time")
    serve.add_argument("--max-batch-images", type=int, default=8, help="images per batch when batching")
    serve.add_argument("--max-images", type=int, default=4, help="largest n per request")
    serve.add_argument("--request-timeout", type=float, default=600.0, help="seconds a job may run")
    serve.add_argument("--queue-timeout", type=float, default=600.0, help="seconds a job may wait in the queue")
    add_limit_flags(serve)  # body size, result store, drain grace (serve/limits.py)
    return serve


def serve_command(args) -> int:
    from ..flags import layout_from_args, model_from_args

    model = model_from_args(args)
    config, vae = layout_from_args(args)
    config.validate()
    vae.validate()
    for name in ("max_queue", "max_batch_images", "max_images"):
        if getattr(args, name) < 1:
            raise ConfigError(f"--{name.replace('_', '-')} must be >= 1, got {getattr(args, name)}")
    if args.request_timeout <= 0 or args.queue_timeout <= 0:
        raise ConfigError("--request-timeout and --queue-timeout must be > 0 seconds")
    check_limit_flags(args)
    from ..models.info import ModelInfo

    info = ModelInfo.from_pretrained(model)
    if info.is_video:
        raise ConfigError(f"meshdit serve answers image requests; this {info.pipeline_class} makes videos: "
                          "use `meshdit generate --output clip.mp4` for it.")
    height, width = args.height or info.default_size[0], args.width or info.default_size[1]
    pipefusion = dict(warmup_steps=args.warmup_steps, num_pipeline_patch=args.num_pipeline_patch,
                      kv_drift_correction=not args.no_kv_drift_correction)
    every_request = GenerateRequest(prompt="-", **pipefusion)  # what the server gives each request
    every_request.validate()
    info.check(config, height, width, args.guidance_scale, max(config.data_parallel_degree, 1),
               every_request.patches(config))
    _check_port(args.host, args.port)
    from ..distributed.launch import check_torchrun_world

    check_torchrun_world(config.world_size)
    from .server_state import ServeSettings  # numpy and the server's modules: only once every check passed

    settings = ServeSettings(
        model=model, config=config, height=height, width=width, steps=args.steps,
        guidance_scale=args.guidance_scale, max_sequence_length=args.max_sequence_length, host=args.host,
        port=args.port, api_key=args.api_key or os.environ.get("MESHDIT_API_KEY") or None,
        max_queue=args.max_queue, batching=not args.no_batching, max_batch_images=args.max_batch_images,
        max_images=args.max_images, request_timeout=args.request_timeout, queue_timeout=args.queue_timeout,
        dtype=args.dtype, vae=vae, verbose=args.verbose, **pipefusion, **limit_settings(args))
    from .launch import serve_ranks

    return serve_ranks(settings)


def _check_port(host: str, port: int) -> None:
    """A taken port is refused here, before any rank starts."""
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError as exc:
            raise ConfigError(f"cannot serve on {host}:{port} ({exc.strerror}): choose another --port") from None
