"""`meshdit generate ...`: one command that validates, starts the ranks and saves the images."""
from __future__ import annotations

import argparse
import sys

from .config import GenerateRequest, ParallelConfig
from .errors import ConfigError, RankFailedError
from .quant.cli_flags import add_fp8_flags, fp8_config_from_args
from .vae import VaeDecodeSettings


def _add(parser, name: str, **kwargs):
    """A kebab-case flag plus xDiT's underscore spelling as an alias."""
    names = [f"--{name}"]
    if "-" in name:
        names.append(f"--{name.replace('-', '_')}")
    parser.add_argument(*names, **kwargs)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="meshdit", description="Run diffusers DiT pipelines over a device mesh.")
    commands = parser.add_subparsers(dest="command", required=True)
    gen = commands.add_parser("generate", help="generate images from prompts")
    _add(gen, "model", default=None, help="pipeline folder or Hub id (default: meshdit's bundled model)")
    _add(gen, "prompt", action="append", default=None, help="the prompt (repeat for several)")
    _add(gen, "prompt-file", default=None, help="a text file with one prompt per line")
    _add(gen, "negative-prompt", default=None)
    _add(gen, "height", type=int, default=None, help="image height in pixels")
    _add(gen, "width", type=int, default=None, help="image width in pixels")
    _add(gen, "steps", type=int, default=None, help="denoising steps")
    gen.add_argument("--num-inference-steps", "--num_inference_steps", dest="steps", type=int, help=argparse.SUPPRESS)
    _add(gen, "seed", type=int, default=0)
    _add(gen, "guidance-scale", type=float, default=None)
    _add(gen, "max-sequence-length", type=int, default=None, help="text tokens (model default if unset)")
    _add(gen, "num-images-per-prompt", type=int, default=1)
    _add(gen, "output", default="meshdit.png", help="x.png, or x.npy for the float32 (H, W, 3) array in [0, 1]")
    _add(gen, "dtype", choices=["float32", "bfloat16", "float16"], default=None,
         help="weights and activations (default: bfloat16 on GPU, float32 on CPU)")
    _add(gen, "ulysses-degree", type=int, default=1)
    _add(gen, "ring-degree", type=int, default=1)
    _add(gen, "pipefusion-parallel-degree", type=int, default=1)
    _add(gen, "num-pipeline-patch", type=int, default=None,
         help="PipeFusion: patches along the height (default: the pipefusion degree)")
    _add(gen, "warmup-steps", type=int, default=1,
         help="PipeFusion: leading steps on the whole image, without stale K/V (all steps: exact)")
    _add(gen, "data-parallel-degree", type=int, default=1)
    _add(gen, "use-cfg-parallel", action="store_true",
         help="run the conditional and unconditional branches on two rank groups")
    _add(gen, "use-parallel-vae", action="store_true", help="decode in row bands over the ranks (exact)")
    _add(gen, "vae-tile-height", type=int, default=None, help="tiled decode: tile height in output pixels")
    _add(gen, "vae-tile-width", type=int, default=None, help="tiled decode: tile width in output pixels")
    _add(gen, "vae-tile-overlap", type=int, default=64, help="tiled decode: overlap in output pixels")
    _add(gen, "verbose", action="store_true")
    add_fp8_flags(gen)
    return parser


def _default_model_settings(args) -> str:
    """The bundled model, with its own default resolution, steps and guidance."""
    from . import default_model

    args.height = args.height or default_model.DEFAULT_HEIGHT
    args.width = args.width or default_model.DEFAULT_WIDTH
    args.steps = args.steps or default_model.DEFAULT_STEPS
    if args.guidance_scale is None:
        args.guidance_scale = default_model.DEFAULT_GUIDANCE
    if args.max_sequence_length is None:
        args.max_sequence_length = default_model.DEFAULT_MAX_SEQUENCE_LENGTH
    return str(default_model.weights_path())


def generate_command(args) -> None:
    from .models.info import ModelInfo
    from .output import check_output_path

    model = args.model or _default_model_settings(args)
    config = ParallelConfig(
        data_parallel_degree=args.data_parallel_degree, cfg_degree=2 if args.use_cfg_parallel else 1,
        pipefusion_parallel_degree=args.pipefusion_parallel_degree, ring_degree=args.ring_degree,
        ulysses_degree=args.ulysses_degree, num_pipeline_patch=args.num_pipeline_patch,
        warmup_steps=args.warmup_steps,
    )
    config.validate()
    vae = VaeDecodeSettings(parallel=args.use_parallel_vae, tile_height=args.vae_tile_height,
                            tile_width=args.vae_tile_width, tile_overlap=args.vae_tile_overlap)
    vae.validate()
    prompts = _prompts(args)
    extra = {} if args.max_sequence_length is None else {"max_sequence_length": args.max_sequence_length}
    request = GenerateRequest(
        prompt=prompts, negative_prompt=args.negative_prompt, height=args.height, width=args.width,
        num_inference_steps=args.steps, guidance_scale=args.guidance_scale, seed=args.seed,
        num_images_per_prompt=args.num_images_per_prompt, extra=extra,
    )
    # Everything that can be checked without weights is checked here, before any rank starts.
    info = ModelInfo.from_pretrained(model)
    height, width = request.height or info.default_size, request.width or info.default_size
    num_images = len(prompts) * args.num_images_per_prompt
    info.check(config, height, width, request.guidance_scale, num_images)
    check_output_path(args.output, num_images)
    # torch, diffusers and transformers are imported only now that the request is known to be valid.
    from .distributed.launch import launch
    from .runner import GenerateJob, run_generate

    job = GenerateJob(model, config, request, args.output, args.dtype, args.verbose, vae, fp8_config_from_args(args))
    launch(run_generate, job, config.world_size)


def _prompts(args) -> list[str]:
    prompts = list(args.prompt or [])
    if args.prompt_file:
        try:
            with open(args.prompt_file) as f:
                prompts += [line.strip() for line in f if line.strip()]
        except OSError as exc:
            raise ConfigError(f"cannot read --prompt-file: {exc}") from None
    if not prompts:
        from .default_model import DEFAULT_PROMPT

        prompts = [DEFAULT_PROMPT]
    return prompts


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        if args.command == "generate":
            generate_command(args)
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
