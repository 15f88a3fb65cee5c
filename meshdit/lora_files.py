"""LoRA adapter files, checked before any rank starts (no torch): --lora PATH[:WEIGHT], --lora-dir, and each file's
safetensors header against the model's transformer weights (docs/lora.md).

The header check covers diffusers' own (PEFT) format, `transformer.<module>.lora_A.weight` [r, in] and
`...lora_B.weight` [out, r]: the module must be a Linear of the model with that many inputs and outputs. Other
formats (kohya, xlabs) are converted by diffusers when the adapter loads, and checked there.
"""
from __future__ import annotations

import json
import math
import os
import sys

from .config_files import read_safetensors_header
from .errors import ConfigError

SUFFIX = ".safetensors"
DIFFUSERS_WEIGHT_NAME = "pytorch_lora_weights.safetensors"
"""The file diffusers' save_lora_weights writes into its folder (and load_lora_weights reads from a folder or Hub id)."""
MAX_LORA_WEIGHT = 100.0
"""|weight| of an adapter at most (--lora PATH:WEIGHT, serve's `loras`, the API): far beyond any useful scale, and
below what overflows an image to NaN (1e30 does)."""
PIPELINES_WITHOUT_LORA_LOADER = frozenset({"PixArtSigmaPipeline", "PixArtAlphaPipeline", "HunyuanDiTPipeline",
                                           "HunyuanVideo15Pipeline", "HunyuanVideo15ImageToVideoPipeline"})
"""meshdit's pipeline classes that diffusers 0.42.1 gives no load_lora_weights (tests/loading/test_lora_bad_input.py checks it against diffusers)."""
PEFT_KEY_PARTS = (".lora_A.", ".lora_B.")


def parse_lora_flag(text: str) -> tuple[str, float]:
    """'PATH[:WEIGHT]' -> (PATH, WEIGHT); weight 1.0 when none is given (a path may itself hold ':'). A bad weight
    is argparse's ArgumentTypeError with meshdit's message (argparse would print any other error as "invalid
    parse_lora_flag value")."""
    import argparse

    path, sep, weight = text.rpartition(":")
    if not (sep and path) or os.path.exists(text):
        return text, 1.0
    try:
        value = float(weight)
    except ValueError:
        if os.path.exists(path):  # FILE:abc: the file is there, its weight is not a number
            raise argparse.ArgumentTypeError(weight_error(f"{path}:{weight}", weight)) from None
        return text, 1.0
    if not check_lora_weight(value):
        raise argparse.ArgumentTypeError(weight_error(text, weight))
    return path, value


def check_lora_weight(value) -> bool:
    """A finite number within +-MAX_LORA_WEIGHT (the one bound of the CLI, serve and the API)."""
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value) and \
        abs(value) <= MAX_LORA_WEIGHT


def weight_error(given: str, weight) -> str:
    return (f"--lora {given!r}: the weight after ':' must be a finite number in -{MAX_LORA_WEIGHT:g}.."
            f"{MAX_LORA_WEIGHT:g}, got {weight!r} (larger weights overflow the image to NaN): e.g. --lora FILE:0.8")


def adapter_file(path: str, flag: str = "--lora") -> str:
    """The adapter file `path` names, as diffusers' load_lora_weights reads it: a .safetensors file; a folder written
    by save_lora_weights (its pytorch_lora_weights.safetensors, else its one .safetensors file); or a Hub id (that
    file of the repository, from the Hub or its cache)."""
    if os.path.isfile(path):
        return path
    if os.path.isdir(path):
        inside = os.path.join(path, DIFFUSERS_WEIGHT_NAME)
        if os.path.isfile(inside):
            return inside
        files = sorted(f for f in os.listdir(path) if f.endswith(SUFFIX) and os.path.isfile(os.path.join(path, f)))
        if len(files) == 1:
            return os.path.join(path, files[0])
        raise ConfigError(f"{flag} {path!r}: a folder without {DIFFUSERS_WEIGHT_NAME} (what diffusers' "
                          f"save_lora_weights writes) and with {len(files) or 'no'} other .safetensors files"
                          f"{': ' + ', '.join(files) if files else ''}: pass the adapter file itself")
    from .config_files import _hub_file, _looks_like_path

    if not _looks_like_path(path) and path.count("/") == 1:
        try:
            return _hub_file(path, DIFFUSERS_WEIGHT_NAME)
        except ConfigError as exc:
            raise ConfigError(f"{flag} {path!r}: no such file or folder here, and as a Hub id its "
                              f"{DIFFUSERS_WEIGHT_NAME} could not be fetched ({str(exc).split('(', 1)[-1].split(')')[0]})"
                              f": download it (e.g. `hf download {path}`) and pass the file, or its folder") from None
    raise ConfigError(f"{flag} {path!r}: no such file or folder; give a LoRA .safetensors file or the folder "
                      "diffusers' save_lora_weights wrote")


def adapter_name(path: str) -> str:
    """An adapter's name: its file's stem, or the folder's name for diffusers' folder (what serve lists in
    /v1/models and requests name)."""
    path = path.rstrip("/")
    if os.path.basename(path) == DIFFUSERS_WEIGHT_NAME:
        path = os.path.dirname(path)
    return os.path.basename(path).removesuffix(SUFFIX)


def adapters_in_dir(folder: str, flag: str = "--lora-dir") -> dict[str, str]:
    """--lora-dir: name -> path of every *.safetensors file in `folder` and of every folder in it that diffusers'
    save_lora_weights wrote (holding pytorch_lora_weights.safetensors), sorted by name."""
    if not os.path.isdir(folder):
        raise ConfigError(f"{flag} {folder!r} is not a folder; give a folder of *.safetensors LoRA files")
    found = {}
    for entry in sorted(os.listdir(folder)):
        path = os.path.join(folder, entry)
        if os.path.isfile(path) and entry.endswith(SUFFIX):
            found[adapter_name(entry)] = path
        elif os.path.isdir(path) and os.path.isfile(os.path.join(path, DIFFUSERS_WEIGHT_NAME)):
            found[adapter_name(entry)] = os.path.join(path, DIFFUSERS_WEIGHT_NAME)
        elif entry.endswith(SUFFIX):  # e.g. a folder named x.safetensors that diffusers did not write
            print(f"meshdit: warning: {flag} {folder!r}: skipping {entry!r}, which is not a LoRA file",
                  file=sys.stderr)
    if not found:
        raise ConfigError(f"{flag} {folder!r} holds no *.safetensors LoRA file nor a folder diffusers' "
                          f"save_lora_weights wrote ({DIFFUSERS_WEIGHT_NAME})")
    return dict(sorted(found.items()))


def named_adapters(paths: list[str]) -> dict[str, str]:
    """name -> path for --lora's files: each named by its stem; two files of one stem is refused."""
    named: dict[str, str] = {}
    for path in paths:
        name = adapter_name(path)
        if name in named and os.path.abspath(named[name]) != os.path.abspath(path):
            raise ConfigError(f"--lora {path!r} and {named[name]!r} have the same name {name!r}: rename one file")
        named[name] = path
    return named


def adapters_for_experts(first: list[str], second: list[str]) -> tuple[tuple, tuple]:
    """--lora files (the first denoiser, `transformer`) and --lora-2 files (Wan 2.2's second expert,
    `transformer_2`) -> (((name, path), ...), ((name, denoisers), ...) for the adapters not on the first alone).
    A file given to both is one adapter loaded into both experts."""
    first, second = [adapter_file(p) for p in first], [adapter_file(p, "--lora-2") for p in second]
    named = named_adapters(first + second)
    given = {"transformer": {os.path.abspath(p) for p in first}, "transformer_2": {os.path.abspath(p) for p in second}}
    into = {name: tuple(expert for expert, paths in given.items() if os.path.abspath(path) in paths)
            for name, path in named.items()}
    return tuple(named.items()), tuple((n, e) for n, e in into.items() if e != ("transformer",))


def with_second_expert(loras: tuple, loras_2: list) -> tuple[tuple, tuple, tuple]:
    """generate's --lora (PATH, WEIGHT) pairs and --lora-2 pairs -> (the request's loras: every adapter once, the
    engine's (name, path) pairs, its lora_experts). A file in both is one adapter with one weight. Each path is
    the adapter file it names (adapter_file: a diffusers folder, a Hub id)."""
    loras = tuple((adapter_file(p), w) for p, w in loras)
    loras_2 = [(adapter_file(p, "--lora-2"), w) for p, w in loras_2]
    weights = {os.path.abspath(p): (p, w) for p, w in loras}
    for path, weight in loras_2:
        given = weights.get(os.path.abspath(path))
        if given is not None and given[1] != weight:
            raise ConfigError(f"--lora-2 {path!r}: also given to --lora with weight {given[1]}, here {weight}: an "
                              "adapter in both experts has one weight; give it the same weight in both")
    request = tuple(loras) + tuple((p, w) for p, w in loras_2 if os.path.abspath(p) not in weights)
    engine, experts = adapters_for_experts([p for p, _ in loras], [p for p, _ in loras_2])
    return request, engine, experts


def read_header(path: str, flag: str = "--lora") -> dict[str, dict]:
    """The safetensors header of an adapter file: tensor name -> {dtype, shape, data_offsets}."""
    if not os.path.isfile(path):
        raise ConfigError(f"{flag} {path!r}: no such file; give a LoRA .safetensors file")
    header, length = read_safetensors_header(path, f"{flag} {path!r}")
    size = os.path.getsize(path)
    for name, meta in header.items():
        if not isinstance(meta, dict) or not isinstance(meta.get("shape"), list) or \
                not isinstance(meta.get("data_offsets"), list) or len(meta["data_offsets"]) != 2:
            raise ConfigError(f"{flag} {path!r}: corrupt safetensors header entry for tensor {name!r}")
        if 8 + length + int(meta["data_offsets"][1]) > size:
            raise ConfigError(f"{flag} {path!r}: truncated: tensor {name!r} ends past the end of the file")
    if not header:
        raise ConfigError(f"{flag} {path!r}: holds no tensor")
    return header


def model_linear_shapes(model: str, component: str = "transformer") -> dict[str, tuple[int, ...]] | None:
    """The model's transformer weights' shapes from their safetensors headers (a local folder only; None for a
    Hub id or a folder without safetensors weights: the adapter is then checked when it loads). component: the
    denoiser's folder (Wan 2.2's second expert: transformer_2)."""
    folder = os.path.join(model, component)
    index = os.path.join(folder, "diffusion_pytorch_model.safetensors.index.json")
    try:
        if os.path.exists(index):
            with open(index) as f:
                files = sorted(set(json.load(f)["weight_map"].values()))
        elif os.path.exists(os.path.join(folder, "diffusion_pytorch_model.safetensors")):
            files = ["diffusion_pytorch_model.safetensors"]
        else:
            return None
        shapes = {}
        for name in files:
            for tensor, meta in read_header(os.path.join(folder, name), "the model's").items():
                shapes[tensor] = tuple(meta["shape"])
        return shapes
    except (OSError, ValueError, KeyError, ConfigError):
        return None  # the model's own loading reports its files


def check_pipeline_takes_lora(pipeline, flag: str = "--lora") -> None:
    """A pipeline without diffusers' LoRA loader (PixArt, HunyuanDiT, ...) is refused, naming it. `pipeline`: its
    class name before ranks start (PIPELINES_WITHOUT_LORA_LOADER), or the loaded pipeline (the engine: diffusers'
    own load_lora_weights and set_adapters, for a pipeline given directly)."""
    name = pipeline if isinstance(pipeline, str) else type(pipeline).__name__
    loaded = not isinstance(pipeline, str)
    if name in PIPELINES_WITHOUT_LORA_LOADER or (
            loaded and not (hasattr(pipeline, "load_lora_weights") and hasattr(pipeline, "set_adapters"))):
        raise ConfigError(f"{flag}: diffusers has no LoRA loader for {name}; drop {flag} / --lora-dir for this model "
                          "(docs/lora.md lists the families that take one)")


def lora_from_args(args) -> tuple[tuple, tuple, tuple]:
    """generate's --lora and --lora-2 flags -> (the request's (path, weight) pairs, the EngineSettings' loras and
    lora_experts): the adapter files are the engine's (loaded when it is built), their weights the request's
    (switched per request without reloading). Each file read as with_second_expert reads it."""
    if getattr(args, "lora_dir", None) or getattr(args, "lora_2_dir", None):  # serve: requests pick by name
        return ((),) + adapters_in_dirs(args.lora_dir, args.lora_2_dir)
    return with_second_expert(tuple(getattr(args, "lora", None) or ()), list(getattr(args, "lora_2", None) or ()))


def adapters_in_dirs(first: str | None, second: str | None) -> tuple[tuple, tuple]:
    """serve's --lora-dir (the first denoiser) and --lora-2-dir (Wan 2.2's second expert) -> the EngineSettings'
    (loras, lora_experts). A name in both folders must be the same file (one adapter loaded into both experts)."""
    named = {"transformer": adapters_in_dir(first) if first else {},
             "transformer_2": adapters_in_dir(second, "--lora-2-dir") if second else {}}
    for name, path in named["transformer_2"].items():
        other = named["transformer"].get(name)
        if other is not None and os.path.realpath(other) != os.path.realpath(path):
            raise ConfigError(f"--lora-dir and --lora-2-dir both hold an adapter named {name!r} ({other!r}, {path!r}): "
                              "a name is one adapter; rename one file, or give both folders the same file")
    loras = dict(named["transformer"], **named["transformer_2"])
    into = {name: tuple(e for e, held in named.items() if name in held) for name in loras}
    return tuple(sorted(loras.items())), tuple((n, e) for n, e in sorted(into.items()) if e != ("transformer",))


def check_adapter_file(path: str, model: str | None = None, flag: str = "--lora",
                       component: str = "transformer") -> None:
    """The file exists and has a readable header; its diffusers-format transformer tensors name Linear layers the
    model's `component` has, with matching sizes (when the model is a local folder). ConfigError naming the file
    and tensor."""
    header = read_header(path, flag)
    shapes = model_linear_shapes(model, component) if model is not None else None
    if shapes is None:
        return
    for tensor, meta in header.items():
        if not tensor.startswith("transformer.") or not any(p in tensor for p in PEFT_KEY_PARTS):
            continue
        module, part = tensor.removeprefix("transformer.").split(".lora_", 1)
        weight = shapes.get(module + ".weight")
        shape = tuple(meta["shape"])
        if weight is None or len(weight) != 2:
            raise ConfigError(f"{flag} {path!r}: tensor {tensor!r} adapts {module!r}, which the model {model!r} "
                              "has no Linear layer of: this adapter was made for another model")
        if len(shape) != 2 or (part.startswith("A") and shape[1] != weight[1]) or \
                (part.startswith("B") and shape[0] != weight[0]):
            raise ConfigError(f"{flag} {path!r}: tensor {tensor!r} has shape {list(shape)}, which does not fit "
                              f"{module!r} of shape {list(weight)} in {model!r}: this adapter was made for "
                              "another model")
