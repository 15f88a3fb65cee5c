"""`meshdit generate ...`: one command that validates, starts the ranks and saves the images."""
from __future__ import annotations

import sys

from . import __version__
from .errors import ConfigError, RankFailedError
from .flags import (FlagParser, add_layout_flags, add_model_flags, add_output_flags, add_request_flags,
                    layout_from_args, model_from_args, request_from_args)
from .preflight import check_output_writable, check_temp_folder, read_prompt_file
from .loading.cli_flags import add_loading_flags, loading_options
from .quant.cli_flags import add_fp8_flags, fp8_config_from_args


def build_parser() -> FlagParser:
    parser = FlagParser(prog="meshdit", description="Run diffusers DiT pipelines over a device mesh.")
    parser.add_argument("--version", action="version", version=f"meshdit {__version__}")
    commands = parser.add_subparsers(dest="command", required=True)
    gen = commands.add_parser("generate", help="generate images from prompts",
                              description="Generate images; the ranks are started on this machine (or joined "
                                          "under torchrun) once every check below has passed.")
    add_model_flags(gen)
    add_request_flags(gen)
    add_layout_flags(gen)
    add_output_flags(gen)
    add_loading_flags(gen)
    add_fp8_flags(gen)
    from .serve.command import add_serve_parser

    add_serve_parser(commands, gen)
    return parser


def model_and_request(args):
    """(model folder or id, ModelInfo, request with every value resolved), checked before any rank starts."""
    from .models.info import ModelInfo

    prompts = list(args.prompt or [])
    if args.prompt_file:
        prompts += read_prompt_file(args.prompt_file)
    if args.prompt is None and not args.prompt_file:
        from .default_model import DEFAULT_PROMPT

        prompts = [DEFAULT_PROMPT]
    request = request_from_args(args, prompts)
    request.validate()  # value ranges first: they need no model
    model = model_from_args(args)
    info = ModelInfo.from_pretrained(model)
    return model, info, request.with_defaults(info.request_defaults())


def warn_unknown_words(model: str, prompts: list[str]) -> None:
    """Once per run, before the ranks start: words the model never saw (only models shipping vocabulary.json)."""
    from .prompt_vocabulary import unknown_words_warning

    note = unknown_words_warning(model, prompts)
    if note:
        print(f"meshdit: warning: {note}", file=sys.stderr)


def warn_if_heavy(model: str, info, config, request, vae, dtype) -> None:
    """Before the ranks start: a request that will take very long or needs more memory than this machine has."""
    from .request_cost import estimate, warning

    note = warning(estimate(model, info, config, request, vae, dtype), request, info.request_defaults())
    if note:
        print(f"meshdit: warning: {note}", file=sys.stderr)


def generate_command(args) -> None:
    from .output import check_output_path

    config, vae = layout_from_args(args)
    config.validate()
    vae.validate()
    # Everything that can be checked without weights is checked here, before any rank starts.
    model, info, request = model_and_request(args)
    info.check_request(config, request)
    warn_unknown_words(model, request.prompts)
    from .vae.settings import check_vae_of_model  # VAE checks from vae/config.json
    check_vae_of_model(model, vae, request.height, request.width)
    num_images = len(request.prompts) * request.num_images_per_prompt
    output = args.output or ("meshdit.mp4" if info.is_video else "meshdit.png")
    check_output_writable(output, num_images)
    check_output_path(output, num_images, info.is_video)
    temp_note = check_temp_folder()
    if temp_note:
        print(f"meshdit: warning: {temp_note}", file=sys.stderr)
    warn_if_heavy(model, info, config, request, vae, args.dtype)
    # torch, diffusers and transformers are imported only now that the request is known to be valid.
    from .distributed.launch import launch
    from .runner import GenerateJob, run_generate

    job = GenerateJob(model, config, request, output, args.dtype, args.verbose, vae, loading_options(args),
                      fp8_config_from_args(args, config.pipefusion_parallel_degree))
    launch(run_generate, job, config.world_size)


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        if args.command == "generate":
            generate_command(args)
        elif args.command == "serve":
            from .serve.command import serve_command

            return serve_command(args)
    except ConfigError as exc:
        print(f"meshdit: error: {exc}", file=sys.stderr)
        return 2
    except RankFailedError as exc:
        print(f"meshdit: error: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("meshdit: interrupted; all ranks stopped", file=sys.stderr)
        return 130
    return 0


if __name__ == "__main__":
    sys.exit(main())
