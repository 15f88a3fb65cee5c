"""Command-line flags, in groups any subcommand can reuse (generate, serve).

The flags of the settings dataclasses (ParallelConfig, GenerateRequest, VaeDecodeSettings, Fp8Config,
LoadOptions) are built from their fields (`flag_spec.flagged`): name, xDiT's spelling and help text are
written once, on the field. The few flags that set no dataclass field (model, dtype, prompt file, output)
are declared here. Every flag has a help text that states its default. Each kebab-case flag also
answers to xDiT's underscore spelling; both are one argparse action, so an abbreviation such as
`--ulysses` is never ambiguous between a flag and its alias.
"""
from __future__ import annotations

import argparse
import re

from .config import BUNDLED, GenerateRequest, ParallelConfig
from .errors import ConfigError
from .engine_settings import DTYPES, EngineSettings
from .flag_spec import cli_default, flag_specs
from .lora_files import parse_lora_flag


class FlagParser(argparse.ArgumentParser):
    """argparse, but an abbreviation that matches only spellings of one flag is not ambiguous, and
    `-1e3`, `-inf`, `-nan` are values (so `--guidance-scale -inf` reaches the range check)."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self._negative_number_matcher = re.compile(r"^-(\d+\.?\d*|\.\d+)(e[-+]?\d+)?$|^-(inf|infinity|nan)$",
                                                   re.IGNORECASE)

    def error(self, message: str):
        """argparse's error, with the nearest flag suggested for a mistyped one (`--num_steps`: did you mean
        --steps?), as Python 3.14's suggest_on_error does."""
        if message.startswith("unrecognized arguments: "):
            hints = [hint for arg in message.split(": ", 1)[1].split() if (hint := self.suggest_flag(arg))]
            if hints:
                message += "; " + "; ".join(hints)
        super().error(message)

    def suggest_flag(self, typed: str) -> str | None:
        """'did you mean --FLAG?' for an unknown `--option[=value]` near one of this command's flags, else None."""
        import difflib

        if not typed.startswith("--"):
            return None
        name = typed.split("=", 1)[0]
        canonical = {}  # every spelling -> the flag's own name (its first spelling)
        for parser in self._all_parsers():
            for action in parser._actions:
                for option in action.option_strings:
                    canonical.setdefault(option, action.option_strings[0])
        match = difflib.get_close_matches(name, canonical, n=1, cutoff=0.6)
        return f"{name}: did you mean {canonical[match[0]]}?" if match else None

    def _all_parsers(self):
        yield self
        for action in self._actions:
            if isinstance(action, argparse._SubParsersAction):
                for parser in action.choices.values():
                    yield from (parser._all_parsers() if isinstance(parser, FlagParser) else (parser,))

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
    flag(group, "dtype", choices=list(DTYPES), default=None,
         help="weights and activations (default: bfloat16 on GPU, float32 on CPU)")
    flag(group, "verbose", action="store_true",
         help="show library logs, loading progress and each rank's VAE decode memory (default: off)")


def model_from_args(args) -> str:
    """The --model folder or Hub id; with no --model, the bundled model's folder."""
    if args.model is not None:
        return args.model
    from .default_model import weights_path

    return str(weights_path())


def add_settings_flags(group, cls, skip: tuple[str, ...] = ()) -> None:
    """The flags of every field of the dataclass `cls` that declares one, in field order (`skip`: dests left out)."""
    for f, spec in flag_specs(cls):
        if spec.dest in skip:
            continue
        flag(group, spec.name, *spec.aliases, dest=spec.dest, default=cli_default(f, spec), help=spec.help,
             **spec.argparse)
        for name, value, help_text in spec.switches:
            flag(group, name, dest=spec.dest, action="store_const", const=value, default=cli_default(f, spec),
                 help=help_text)


def settings_from_args(cls, args, **values):
    """`cls` built from the parsed flags of its fields (`values` add or override fields); a field whose flag
    this subcommand does not have (serve has no --seed) keeps the field's default."""
    for f, spec in flag_specs(cls):
        if f.name not in values and hasattr(args, spec.dest):
            value = getattr(args, spec.dest)
            values[f.name] = spec.to_field(value) if spec.to_field else value
    return cls(**values)


def add_layout_flags(parser) -> None:
    """How the work is split over ranks: the mesh degrees, PipeFusion and VAE decode settings."""
    from .vae.settings import VaeDecodeSettings

    group = parser.add_argument_group("parallel layout (the world size is the product of the degrees)")
    add_settings_flags(group, ParallelConfig)
    flag(group, "layout", choices=["auto"], default=None,
         help="auto: the planner picks the degrees for --ranks ranks (docs/planner.md); degrees above 1 given "
              "beside it are kept (default: the degrees as given)")
    flag(group, "ranks", type=int, default=None, metavar="N",
         help="with --layout auto: the world to plan for (default: torchrun's world, else the visible GPUs, "
              "else 1 on CPU)")
    add_settings_flags(parser.add_argument_group("VAE decode"), VaeDecodeSettings)


def add_engine_flags(parser) -> None:
    """Every flag of EngineSettings: model and dtype, the layout (with --compile) and VAE decode, loading, FP8.
    `meshdit generate` and `meshdit serve` both take exactly these (engine_settings_from_args reads them)."""
    from .loading.options import LoadOptions
    from .quant.settings import Fp8Config

    add_model_flags(parser)
    add_layout_flags(parser)
    add_settings_flags(parser, LoadOptions)  # LoadOptions' fields declare their own argument group
    add_settings_flags(parser.add_argument_group("FP8 (docs/fp8.md: each option's measured error)"), Fp8Config)


def engine_settings_from_args(args) -> EngineSettings:
    """The EngineSettings the flags of add_engine_flags give (checked later, by prelaunch.check_before_launch)."""
    from .loading.options import LoadOptions
    from .quant.settings import Fp8Config

    from .lora_files import lora_from_args

    config, vae = layout_from_args(args)
    _, loras, lora_experts = lora_from_args(args)  # generate's --lora / --lora-2 files (serve: --lora-dir's, later)
    return EngineSettings(model_from_args(args), config, args.dtype, vae, settings_from_args(LoadOptions, args),
                          settings_from_args(Fp8Config, args), args.verbose, loras, lora_experts)


def add_request_flags(parser, skip: tuple[str, ...] = (),
                      title: str = "request (unset values come from the model)") -> None:
    """What to draw: prompts, size, steps, seed, guidance; `skip`: the dests of flags this subcommand leaves out
    (serve takes prompts, seeds and image counts per request)."""
    group = parser.add_argument_group(title)
    add_settings_flags(group, GenerateRequest, skip)
    if "height" not in skip:
        flag(group, "size", default=None, metavar="WxH",
             help="width x height in pixels, as serve's and the OpenAI API's `size`: --size 1024x768 is --width 1024 "
                  "--height 768 (default: --height and --width)")
    if "prompt_file" not in skip:
        flag(group, "prompt-file", default=None, metavar="FILE",
             help="a UTF-8 text file with one prompt per line, blank lines skipped (default: none)")
    # A recipe argument (GenerateRequest.extra), not a request field.
    flag(group, "max-sequence-length", type=int, default=None, metavar="T",
         help=f"text tokens per prompt, >= 1 and <= 512 for T5 encoders (FLUX.1, SD3) "
              f"(default: the pipeline's, e.g. FLUX.1 512; {BUNDLED}: 32)")
    flag(group, "extra", action="append", default=None, metavar="KEY=JSON",
         help="a pipeline __call__ argument without a flag of its own, its value in JSON, repeatable; "
              "the family's keys only (HunyuanVideo: prompt_template, LTX: decode_timestep, decode_noise_scale), "
              "e.g. --extra 'prompt_template={\"template\": \"{}\", \"crop_start\": 0}' (default: none)")
    if "lora_2" not in skip:  # an engine adapter, switched on for this request as --lora's are
        flag(group, "lora-2", action="append", type=parse_lora_flag, default=None, metavar="PATH[:WEIGHT]",
             help="Wan 2.2 A14B: a LoRA adapter for the second (low-noise) expert, transformer_2, as diffusers' "
                  "load_into_transformer_2; repeatable; a file given to --lora too loads into both experts "
                  "(default: none; docs/lora.md)")
    add_cache_flags(parser)  # GenerateRequest.cache: its own group


def add_cache_flags(parser) -> None:
    """Step caching (CacheSettings' fields), and xDiT's switches for it."""
    from .cache_settings import CacheSettings

    group = parser.add_argument_group("step cache (lossy; docs/caching.md)")
    add_settings_flags(group, CacheSettings)
    flag(group, "use-fbcache", action="store_true",
         help="xDiT's spelling of --cache fbcache (default: off)")
    flag(group, "use-teacache", action="store_true",
         help="xDiT's TeaCache switch: refused, meshdit has no TeaCache (it needs per-model coefficients); use "
              "--cache fbcache, the nearest equivalent, or --cache dbcache (default: off)")


def cache_from_args(args) -> "CacheSettings":  # noqa: F821 - lazy name
    """The request's cache settings as the flags give them; --use-teacache is refused here, naming what to use."""
    from .cache_settings import CacheSettings

    if getattr(args, "use_teacache", False):
        raise ConfigError("--use-teacache: meshdit has no TeaCache (it needs coefficients fitted per model); use "
                          "--cache fbcache (First-Block Cache, the nearest equivalent) or --cache dbcache.")
    values = {}
    if getattr(args, "use_fbcache", False):
        if args.cache not in (None, "fbcache"):
            raise ConfigError(f"--use-fbcache and --cache {args.cache} ask for two caches: keep one of them.")
        values["method"] = "fbcache"
    return settings_from_args(CacheSettings, args, **values)


def add_output_flags(parser) -> None:
    group = parser.add_argument_group("output")
    flag(group, "output", default=None, metavar="PATH",
         help="x.png (or .jpg, .webp) for the image, x.npy for the float32 (H, W, 3) array in [0, 1]; video "
              "models: x.mp4 (H.264), x.gif or x.webp (animated), x.npy (F, H, W, 3); several images or videos "
              "need {i} in the name, e.g. out-{i}.png; video models write meshdit.mp4 unless told (default: meshdit.png)")


def layout_from_args(args) -> tuple[ParallelConfig, "VaeDecodeSettings"]:  # noqa: F821 - lazy name
    from .vae.settings import VaeDecodeSettings

    return settings_from_args(ParallelConfig, args), settings_from_args(VaeDecodeSettings, args)


def request_from_args(args, prompts: list[str]) -> GenerateRequest:
    """The request as the flags give it; unset values stay None until the model's defaults fill them."""
    extra = parse_extra(getattr(args, "extra", None))
    if args.max_sequence_length is not None:
        extra["max_sequence_length"] = args.max_sequence_length
    size = {}
    if getattr(args, "size", None) is not None:
        size = dict(zip(("width", "height"), parse_size(args.size)))
        for side, value in size.items():
            given = getattr(args, side, None)
            if given is not None and given != value:
                raise ConfigError(f"--size {args.size} says {side} {value} but --{side} {given}: give one of them.")
    from .lora_files import lora_from_args

    loras = lora_from_args(args)[0]  # every adapter of --lora and --lora-2 once, at its weight
    return settings_from_args(GenerateRequest, args, prompt=prompts, extra=extra, cache=cache_from_args(args),
                              loras=loras, **size)


def parse_size(text: str) -> tuple[int, int]:
    """--size 'WxH' -> (width, height), as serve's `size` field and the OpenAI API write it."""
    match = re.fullmatch(r"\s*(\d+)\s*[xX]\s*(\d+)\s*", text or "")
    if not match:
        raise ConfigError(f"--size {text!r} is not WxH: write width x height in pixels, e.g. --size 1024x768 "
                          "(1024 wide, 768 high).")
    return int(match.group(1)), int(match.group(2))


def parse_extra(items: list[str] | None) -> dict:
    """--extra KEY=JSON items -> {KEY: value}; which keys a model takes is ModelInfo.check_call_arguments'."""
    import json

    extra = {}
    for item in items or ():
        key, sep, text = item.partition("=")
        if not sep or not key.isidentifier():
            raise ConfigError(f"--extra {item!r}: write KEY=JSON, e.g. --extra decode_timestep=0.05.")
        if key == "max_sequence_length":
            raise ConfigError("--extra max_sequence_length: use --max-sequence-length.")
        try:
            extra[key] = json.loads(text)
        except ValueError as exc:
            raise ConfigError(f"--extra {key}: its value {text!r} is not JSON ({exc}); quote text as JSON, "
                              f"e.g. --extra '{key}=\"text\"'.") from None
    return extra
