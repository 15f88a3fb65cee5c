"""`meshdit serve`: its flags (generate's engine and request-default flags, plus the server's own) and the checks
before any rank starts (prelaunch.check_before_launch, as for generate, plus the server's)."""
from __future__ import annotations

import argparse
import ipaddress
import os
import socket
import sys

from ..errors import ConfigError
from .limits import add_limit_flags, check_limit_flags, limit_settings

# generate's flags that serve does not take: each is a value of one HTTP request (its JSON field), or names
# what only generate does. Every other generate flag is a serve flag too (tests/serve/test_command.py checks).
GENERATE_ONLY = {
    "prompt": "per request: the request's `prompt`",
    "prompt_file": "per request: prompts arrive over HTTP",
    "negative_prompt": "per request: the request's `negative_prompt`",
    "seed": "per request: the request's `seed`",
    "num_images_per_prompt": "per request: the request's `n`",
    "output": "generate writes files; serve answers with PNGs",
    "image": "per request: the request's `image` (base64 in JSON, or a multipart/form-data upload)",
    "lora": "per request: the request's `loras`, among the adapters of --lora-dir",
    "force": "generate's override of its memory refusal; serve refuses a request it cannot price by its limits",
    "lora_2": "per request: the request's `loras_2`, among the adapters of --lora-2-dir",
}
LOOPBACK_NAMES = ("localhost",)


def add_serve_parser(commands) -> argparse.ArgumentParser:
    from ..flags import add_engine_flags, add_request_flags

    serve = commands.add_parser("serve", help="serve an OpenAI-compatible image and video API over the mesh",
                                description="Serve images or videos over HTTP; the engine flags and request defaults are "
                                            "`meshdit generate`'s (docs/serving.md).")
    add_engine_flags(serve)
    add_request_flags(serve, skip=tuple(GENERATE_ONLY),
                      title="request defaults (what a request leaves unset; unset here: the model's)")
    group = serve.add_argument_group("server")
    group.add_argument("--host", default="127.0.0.1",
                       help="address to listen on (default: 127.0.0.1; any other needs --api-key or "
                            "--allow-unauthenticated)")
    group.add_argument("--port", type=int, default=8000, help="port to listen on (default: 8000)")
    group.add_argument("--api-key", default=None,
                       help="require 'Authorization: Bearer KEY' (default: env MESHDIT_API_KEY; unset: no key)")
    group.add_argument("--allow-unauthenticated", action="store_true",
                       help="serve a non-loopback --host without an API key: anyone who reaches the port can use "
                            "the machine's accelerators (default: refused)")
    group.add_argument("--max-queue", type=int, default=16, help="jobs that may wait; more get 429 (default: 16)")
    group.add_argument("--no-batching", action="store_true", help="run one request at a time (default: batch requests that share size, steps and guidance)")
    group.add_argument("--max-batch-images", type=int, default=8, help="images per batch when batching (default: 8)")
    group.add_argument("--max-images", type=int, default=4, help="largest n per request (default: 4)")
    group.add_argument("--request-timeout", type=float, default=600.0, help="seconds a job may run (default: 600)")
    group.add_argument("--queue-timeout", type=float, default=600.0, help="seconds a job may wait in the queue (default: 600)")
    group.add_argument("--lora-dir", default=None, metavar="DIR",
                       help="LoRA adapters every rank loads at start: each *.safetensors file in DIR, named by its "
                            "file stem; requests choose them by name in `loras` (default: none; docs/lora.md)")
    group.add_argument("--lora-2-dir", default=None, metavar="DIR",
                       help="Wan 2.2 A14B: LoRA adapters for the second (low-noise) expert, transformer_2, as "
                            "--lora-dir's; requests choose them in `loras_2`; a file in both folders loads into both "
                            "experts (default: none; docs/lora.md)")
    add_limit_flags(serve)  # body size, result store, drain grace (serve/limits.py)
    ray = serve.add_argument_group("replicas on Ray Serve (pip install meshdit[ray]; docs/serving.md)")
    ray.add_argument("--ray", action="store_true",
                     help="deploy on Ray Serve: --replicas meshes of this layout behind Serve's proxy on --host/--port "
                          "(default: one mesh on this machine)")
    ray.add_argument("--replicas", type=int, default=1, help="with --ray: replicas, each one mesh (default: 1)")
    ray.add_argument("--ray-address", default=None, metavar="ADDRESS",
                     help="with --ray: the cluster to join (default: env RAY_ADDRESS, else a local cluster)")
    ray.add_argument("--ray-gpus-per-rank", type=float, default=None, metavar="N",
                     help="with --ray: GPUs Ray assigns each rank (default: 1 where the cluster has GPUs, else 0)")
    ray.add_argument("--ray-cpus-per-rank", type=float, default=1.0, metavar="N",
                     help="with --ray: CPUs Ray reserves for each rank (default: 1; below 1 packs more CPU ranks "
                          "on a node than it has cores, as the tests do)")
    ray.add_argument("--ray-autoscaling", default=None, metavar="JSON",
                     help="with --ray: Ray Serve's autoscaling_config, e.g. '{\"min_replicas\": 1, \"max_replicas\": 4, "
                          "\"target_ongoing_requests\": 2}' (replaces --replicas; default: none, a fixed --replicas)")
    return serve


def serve_settings(args, check_port: bool = False):
    """The ServeSettings the flags give, after every check that needs no rank (the port's only if asked)."""
    from ..flags import engine_settings_from_args, request_from_args
    from ..prelaunch import check_before_launch

    for name in ("max_queue", "max_batch_images", "max_images"):
        if getattr(args, name) < 1:
            raise ConfigError(f"--{name.replace('_', '-')} must be >= 1, got {getattr(args, name)}")
    if args.request_timeout <= 0 or args.queue_timeout <= 0:
        raise ConfigError("--request-timeout and --queue-timeout must be > 0 seconds")
    check_limit_flags(args)
    api_key = args.api_key or os.environ.get("MESHDIT_API_KEY") or None
    check_exposure(args.host, api_key, args.allow_unauthenticated)
    from ..planner.auto import describe_choice, layout_from_flags

    request = request_from_args(args, ["-"])
    engine, prediction = layout_from_flags(args, engine_settings_from_args(args), request)
    if prediction is not None:
        print(f"meshdit serve: {describe_choice(engine, prediction)}")
    # The smallest batch a request may make: one image per data-parallel group. Each request is resolved from
    # `request` (the flags' values, unset ones unset) in ServerState.make_job, as generate resolves its own.
    info, defaults = check_before_launch(engine, request, num_images=max(engine.config.data_parallel_degree, 1),
                                         image_per_request=True)
    if info.is_video and engine.config.data_parallel_degree > 1:
        raise ConfigError(f"--data-parallel-degree {engine.config.data_parallel_degree}: each video request makes one "
                          "video, and data parallelism needs one per group in every request: give the ranks to "
                          "--ulysses-degree, --ring-degree or --cfg-degree instead.")
    if check_port:
        _check_port(args.host, args.port)
    from .server_state import ServeSettings  # numpy and the server's modules: only once every check passed

    return ServeSettings(
        engine=engine, request=defaults, flags=request, host=args.host, port=args.port, api_key=api_key,
        max_queue=args.max_queue,
        batching=not args.no_batching, max_batch_images=args.max_batch_images, max_images=args.max_images,
        request_timeout=args.request_timeout, queue_timeout=args.queue_timeout,
        **limit_settings(args))


def ray_options(args) -> dict | None:
    """--ray's settings, checked before anything starts (None without --ray)."""
    import json

    given = [f for f in ("replicas", "ray_address", "ray_gpus_per_rank", "ray_cpus_per_rank", "ray_autoscaling")
             if getattr(args, f) not in (None, 1)]
    if not args.ray:
        if given:
            raise ConfigError(f"--{given[0].replace('_', '-')} is a setting of --ray: add --ray, or drop it")
        return None
    if args.replicas < 1:
        raise ConfigError(f"--replicas must be >= 1, got {args.replicas}")
    if args.ray_gpus_per_rank is not None and not 0 <= args.ray_gpus_per_rank <= 8:
        raise ConfigError(f"--ray-gpus-per-rank must be between 0 and 8, got {args.ray_gpus_per_rank:g}")
    if not 0 < args.ray_cpus_per_rank <= 256:
        raise ConfigError(f"--ray-cpus-per-rank must be > 0 and at most 256, got {args.ray_cpus_per_rank:g}")
    autoscaling = None
    if args.ray_autoscaling is not None:
        try:
            autoscaling = json.loads(args.ray_autoscaling)
        except ValueError as exc:
            raise ConfigError(f"--ray-autoscaling is not JSON ({exc}): give Ray Serve's autoscaling_config as an "
                              "object, e.g. '{\"min_replicas\": 1, \"max_replicas\": 4}'") from None
        if not isinstance(autoscaling, dict):
            raise ConfigError("--ray-autoscaling must be a JSON object (Ray Serve's autoscaling_config)")
    try:
        import ray  # noqa: F401
        from ray import serve  # noqa: F401
    except ImportError:
        raise ConfigError("--ray needs Ray Serve: pip install 'meshdit[ray]' (or pip install 'ray[serve]')") from None
    return {"replicas": args.replicas, "autoscaling": autoscaling, "address": args.ray_address,
            "gpus_per_rank": args.ray_gpus_per_rank, "cpus_per_rank": args.ray_cpus_per_rank}


def serve_command(args) -> int:
    ray = ray_options(args)
    if ray is not None:
        from .ray_app import run_on_ray

        return run_on_ray(serve_settings(args, check_port=True), **ray)
    settings = serve_settings(args, check_port=True)
    if settings.api_key is None and not is_loopback(args.host):
        print(f"meshdit: WARNING: serving on {args.host}:{args.port} WITHOUT an API key "
              "(--allow-unauthenticated): anyone who can reach this port can run generations on this machine. "
              "Set --api-key or MESHDIT_API_KEY to require one.", file=sys.stderr, flush=True)
    from .launch import serve_ranks

    return serve_ranks(settings)


def is_loopback(host: str) -> bool:
    """Whether `host` is reachable from this machine only (a name counts if every address it has is loopback)."""
    if host.lower() in LOOPBACK_NAMES:
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:  # a host name
        try:
            addresses = {info[4][0] for info in socket.getaddrinfo(host, None)}
        except OSError:
            return False
        return bool(addresses) and all(ipaddress.ip_address(a.split("%")[0]).is_loopback for a in addresses)


def check_exposure(host: str, api_key: str | None, allow_unauthenticated: bool) -> None:
    """A server reachable from other machines must ask for a key, unless the user says otherwise explicitly."""
    if api_key is None and not allow_unauthenticated and not is_loopback(host):
        raise ConfigError(f"--host {host} is reachable from other machines, and no API key is set: anyone who can "
                          "reach the port could use this machine's accelerators. Set --api-key (or "
                          "MESHDIT_API_KEY), or pass --allow-unauthenticated to serve without one.")


def _check_port(host: str, port: int) -> None:
    """A taken port is refused here, before any rank starts."""
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError as exc:
            raise ConfigError(f"cannot serve on {host}:{port} ({exc.strerror}): choose another --port") from None
