"""`meshdit generate ...`: one command that validates, starts the ranks and saves the images."""
from __future__ import annotations

import sys

from . import __version__
from .errors import ConfigError, RankFailedError
from .flags import (FlagParser, add_engine_flags, add_output_flags, add_request_flags, engine_settings_from_args,
                    flag, request_from_args)
from .preflight import check_output_writable, check_temp_folder, read_prompt_file


def build_parser() -> FlagParser:
    parser = FlagParser(prog="meshdit", description="Run diffusers DiT pipelines over a device mesh.")
    parser.add_argument("--version", action="version", version=f"meshdit {__version__}")
    commands = parser.add_subparsers(dest="command", required=True)
    gen = commands.add_parser("generate", help="generate images from prompts",
                              description="Generate images; the ranks are started on this machine (or joined "
                                          "under torchrun) once every check below has passed.")
    add_engine_flags(gen)
    add_request_flags(gen)
    add_output_flags(gen)
    flag(gen, "force", action="store_true",
         help="start a request whose predicted memory exceeds what the ranks can get (default: refuse it)")
    from .serve.command import add_serve_parser

    add_serve_parser(commands)
    from .planner.command import add_plan_parser

    add_plan_parser(commands)
    return parser


def requested(args):
    """The request as generate's flags give it (GenerateRequest's default prompt, the API's too, when none is
    given); unset values stay None until check_before_launch resolves it (request.resolve_request)."""
    prompts = list(args.prompt or [])
    if args.prompt_file:
        prompts += read_prompt_file(args.prompt_file)
    if args.prompt is None and not args.prompt_file:
        from .config import GenerateRequest

        prompts = [GenerateRequest().prompt]
    return request_from_args(args, prompts)


def generate_settings(args):
    """(EngineSettings, ModelInfo, request with every value resolved), checked before any rank starts."""
    return generate_plan(args)[:3]


def generate_plan(args):
    """generate_settings and, under --layout auto, the planner's prediction for its choice (else None)."""
    from .planner.auto import layout_from_flags
    from .prelaunch import check_before_launch

    request = requested(args)  # --lora's and --lora-2's weights: the request's; their files: the engine's
    engine, prediction = layout_from_flags(args, engine_settings_from_args(args), request)
    info, request = check_before_launch(engine, request)
    return engine, info, request, prediction


def warn_unknown_words(model: str, prompts: list[str]) -> None:
    """Once per run, before the ranks start: words the model never saw (only models shipping vocabulary.json)."""
    from .prompt_vocabulary import unknown_words_warning

    note = unknown_words_warning(model, prompts)
    if note:
        print(f"meshdit: warning: {note}", file=sys.stderr)


def check_request_cost(engine, info, request, force: bool = False) -> None:
    """Before the ranks start, by the planner's cost model: refuses a request whose predicted memory exceeds what the
    ranks can get (unless --force), warns of one that will take very long (naming the predicted time)."""
    from .request_cost import estimate, refusal, warning

    try:
        cost = estimate(engine, info, request)
    except ConfigError as exc:  # a field only the cost model reads (diffusers would take its class default)
        print(f"meshdit: warning: no memory or time estimate for this request: {exc}", file=sys.stderr)
        return
    refused = None if force else refusal(cost, request, info.request_defaults())  # the defaults: what it compares to
    if refused:
        raise ConfigError(refused)
    note = warning(cost, request, info.request_defaults())
    if note:
        print(f"meshdit: warning: {note}", file=sys.stderr)


def generate_command(args) -> None:
    from .output import check_output_path

    # Everything that can be checked without weights is checked here, before any rank starts.
    engine, info, request, prediction = generate_plan(args)
    if prediction is not None:
        from .planner.auto import describe_choice

        print(f"meshdit: {describe_choice(engine, prediction)}")
    warn_unknown_words(engine.model, request.prompts)
    from .config import blank_prompts_note

    if blank_prompts_note(request.prompts):
        print(f"meshdit: warning: {blank_prompts_note(request.prompts)}", file=sys.stderr)
    num_images = len(request.prompts) * request.num_images_per_prompt
    output = args.output or ("meshdit.mp4" if info.is_video else "meshdit.png")
    check_output_writable(output, num_images)
    check_output_path(output, num_images, info.is_video)
    temp_note = check_temp_folder()
    if temp_note:
        print(f"meshdit: warning: {temp_note}", file=sys.stderr)
    check_request_cost(engine, info, request, args.force)
    # torch, diffusers and transformers are imported only now that the request is known to be valid.
    from .distributed.launch import launch
    from .runner import GenerateJob, run_generate

    launch(run_generate, GenerateJob(engine, request, output, prediction.total_s if prediction else None),
           engine.config.world_size)


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        if args.command == "generate":
            generate_command(args)
        elif args.command == "serve":
            from .serve.command import serve_command

            return serve_command(args)
        elif args.command == "plan":
            from .planner.command import plan_command

            return plan_command(args)
    except ConfigError as exc:
        print(f"meshdit: error: {exc}", file=sys.stderr)
        return 2
    except RankFailedError as exc:  # on a line of its own: a failed rank's progress bar may have left its line open
        print(f"\nmeshdit: error: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        from .distributed.launch import INTERRUPTED

        print(INTERRUPTED, file=sys.stderr)
        return 130
    return 0


if __name__ == "__main__":
    sys.exit(main())
