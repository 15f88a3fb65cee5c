"""Command-line flags, in groups any subcommand can reuse (generate; later serve).

Every flag has a help text that states its default. Each kebab-case flag also
answers to xDiT's underscore spelling; both are one argparse action, so an
abbreviation such as `--ulysses` is never ambiguous between a flag and its alias.
"""
from __future__ import annotations

import argparse
import re

from .config import GenerateRequest, ParallelConfig

# The bundled model's own settings, as the help texts quote them (meshdit/default_model/__init__.py).
BUNDLED = "meshdit's bundled model"
PIPEFUSION_WARMUP_COST = (
    "with 1 warmup step of 20 the README's prompt on the bundled model gives 28.2 dB PSNR against serial and "
    "faint stripes; --warmup-steps equal to --steps gives the serial image exactly")


class FlagParser(argparse.ArgumentParser):
    """argparse, but an abbreviation that matches only spellings of one flag is not ambiguous, and
    `-1e3`, `-inf`, `-nan` are values (so `--guidance-scale -inf` reaches the range check)."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self._negative_number_matcher = re.compile(r"^-(\d+\.?\d*|\.\d+)(e[-+]?\d+)?$|^-(inf|infinity|nan)$",
                                                   re.IGNORECASE)

    def _get_option_tuples(self, option_string):
        unique, seen = [], set()
        for option_tuple in super()._get_option_tuples(option_string):
            if id(option_tuple[0]) not in seen:  # option_tuple[0]: the action all spellings share
                seen.add(id(option_tuple[0]))
                unique.append(option_tuple)
        return unique


def flag(parser, name: str, *aliases: str, **kwargs) -> None:
    """--name, its underscore spelling (xDiT's) and `aliases`, as one action."""
    names = [f"--{name}"]
    for alias in (name.replace("-", "_"), *aliases):
        if f"--{alias}" not in names:
            names.append(f"--{alias}")
    parser.add_argument(*names, **kwargs)


def add_model_flags(parser) -> None:
    """Which model, in which precision, how talkative: shared by every subcommand that loads a model."""
    group = parser.add_argument_group("model")
    flag(group, "model", default=None, metavar="DIR_OR_HUB_ID",
         help=f"diffusers pipeline folder or Hugging Face Hub id (default: {BUNDLED}, meshdit/default_model)")
    flag(group, "dtype", choices=["float32", "bfloat16", "float16"], default=None,
         help="weights and activations (default: bfloat16 on GPU, float32 on CPU)")
    flag(group, "verbose", action="store_true",
         help="show library logs, loading progress and each rank's VAE decode memory (default: off)")


def add_layout_flags(parser) -> None:
    """How the work is split over ranks: the mesh degrees, PipeFusion and VAE decode settings."""
    group = parser.add_argument_group("parallel layout (the world size is the product of the degrees)")
    flag(group, "ulysses-degree", type=int, default=1, metavar="U",
         help="Ulysses sequence parallelism: all-to-all between sequence and head shards; at most the model's "
              "attention heads (default: 1)")
    flag(group, "ring-degree", type=int, default=1, metavar="R",
         help="ring attention: K/V blocks passed around R ranks (default: 1)")
    flag(group, "use-cfg-parallel", action="store_true",
         help="run the conditional and unconditional guidance branches on two rank groups (default: off)")
    flag(group, "data-parallel-degree", type=int, default=1, metavar="D",
         help="split the images (prompts x images per prompt) over D rank groups (default: 1)")
    flag(group, "pipefusion-parallel-degree", type=int, default=1, metavar="P",
         help="PipeFusion: transformer blocks in P pipeline stages over image patches, with one-step-stale "
              "K/V after the warmup steps (approximate; default: 1, off)")
    flag(group, "num-pipeline-patch", type=int, default=None, metavar="M",
         help="PipeFusion: patches along the image height (default: the PipeFusion degree)")
    flag(group, "warmup-steps", type=int, default=1, metavar="K",
         help=f"PipeFusion: leading steps run on the whole image without stale K/V (default: 1; "
              f"{PIPEFUSION_WARMUP_COST})")
    vae = parser.add_argument_group("VAE decode")
    flag(vae, "use-parallel-vae", action="store_true",
         help="decode in row bands over the ranks; exact (default: off, rank 0 decodes alone)")
    flag(vae, "vae-tile-height", type=int, default=None, metavar="PX",
         help="tiled decode: tile height in output pixels (default: no tiling)")
    flag(vae, "vae-tile-width", type=int, default=None, metavar="PX",
         help="tiled decode: tile width in output pixels (default: no tiling)")
    flag(vae, "vae-tile-overlap", type=int, default=64, metavar="PX",
         help="tiled decode: pixels neighbouring tiles share (default: 64)")


def add_request_flags(parser) -> None:
    """What to draw: prompts, size, steps, seed, guidance."""
    group = parser.add_argument_group("request (unset values come from the model)")
    flag(group, "prompt", action="extend", nargs="+", default=None, metavar="TEXT",
         help="one or more prompts; repeatable: --prompt 'a' 'b' or --prompt 'a' --prompt 'b' "
              "(default: the bundled model's example prompt when neither --prompt nor --prompt-file is given)")
    flag(group, "prompt-file", default=None, metavar="FILE",
         help="a UTF-8 text file with one prompt per line, blank lines skipped (default: none)")
    flag(group, "negative-prompt", default=None, metavar="TEXT",
         help="what to steer away from, with classifier-free guidance (default: empty)")
    flag(group, "height", type=int, default=None, metavar="H",
         help=f"image height in pixels, 1..8192 and a multiple of the model's patch size "
              f"(default: the model's; {BUNDLED}: 256)")
    flag(group, "width", type=int, default=None, metavar="W",
         help=f"image width in pixels, like --height (default: the model's; {BUNDLED}: 256)")
    flag(group, "steps", "num-inference-steps", "num_inference_steps", type=int, default=None, metavar="N",
         help=f"denoising steps, >= 1 (default: the model family's, e.g. FLUX.1 28; {BUNDLED}: 20)")
    flag(group, "seed", type=int, default=0, metavar="S",
         help="random seed of the initial noise, 0..2**64-1; the same seed gives the same image on every "
              "layout (default: 0)")
    flag(group, "guidance-scale", type=float, default=None, metavar="G",
         help=f"guidance scale, a finite number; > 1 turns classifier-free guidance on where the model uses it "
              f"(default: the model family's, e.g. FLUX.1 3.5; {BUNDLED}: 3.0)")
    flag(group, "max-sequence-length", type=int, default=None, metavar="T",
         help=f"text tokens per prompt, >= 1 and <= 512 for T5 encoders (FLUX.1, SD3) "
              f"(default: the pipeline's, e.g. FLUX.1 512; {BUNDLED}: 32)")
    flag(group, "num-images-per-prompt", type=int, default=1, metavar="K",
         help="images per prompt, >= 1 (default: 1)")


def add_output_flags(parser) -> None:
    group = parser.add_argument_group("output")
    flag(group, "output", default="meshdit.png", metavar="PATH",
         help="x.png (or .jpg, .webp) for the image, x.npy for the float32 (H, W, 3) array in [0, 1]; several "
              "images need {i} in the name, e.g. out-{i}.png (default: meshdit.png)")


def layout_from_args(args) -> tuple[ParallelConfig, "VaeDecodeSettings"]:  # noqa: F821 - lazy name
    from .vae.settings import VaeDecodeSettings

    config = ParallelConfig(
        data_parallel_degree=args.data_parallel_degree, cfg_degree=2 if args.use_cfg_parallel else 1,
        pipefusion_parallel_degree=args.pipefusion_parallel_degree, ring_degree=args.ring_degree,
        ulysses_degree=args.ulysses_degree, num_pipeline_patch=args.num_pipeline_patch,
        warmup_steps=args.warmup_steps,
    )
    vae = VaeDecodeSettings(parallel=args.use_parallel_vae, tile_height=args.vae_tile_height,
                            tile_width=args.vae_tile_width, tile_overlap=args.vae_tile_overlap)
    return config, vae


def request_from_args(args, prompts: list[str]) -> GenerateRequest:
    """The request as the flags give it; unset values stay None until the model's defaults fill them."""
    extra = {} if args.max_sequence_length is None else {"max_sequence_length": args.max_sequence_length}
    return GenerateRequest(
        prompt=prompts, negative_prompt=args.negative_prompt, height=args.height, width=args.width,
        num_inference_steps=args.steps, guidance_scale=args.guidance_scale, seed=args.seed,
        num_images_per_prompt=args.num_images_per_prompt, extra=extra,
    )
