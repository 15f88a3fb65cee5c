"""Reading a model's config files (model_index.json, <component>/config.json) from a pipeline folder or the
Hub, and safetensors headers, without torch: the checks made before any rank starts (models/info.py,
vae/settings.py, lora_files.py, request_cost.py) read only these, and lean loading reads headers here too."""
from __future__ import annotations

import json
import math
import os
import struct
from dataclasses import dataclass

from .errors import ConfigError


def read_json(model: str, name: str) -> dict:
    """The JSON object `name` (e.g. "vae/config.json") of the pipeline folder or Hub id `model`; a ConfigError
    naming the fix when the folder, the file or the Hub is missing, or the file is not a JSON object."""
    if os.path.isdir(model):
        path = os.path.join(model, name)
        if not os.path.exists(path):
            raise ConfigError(f"{model} is not a diffusers pipeline folder: {name} is missing. Pass a folder "
                              "written by save_pretrained, or a Hugging Face Hub id.")
    elif _looks_like_path(model):
        raise ConfigError(f"model {model!r} was not found: there is no such folder. Pass a folder saved with "
                          "save_pretrained, or a Hugging Face Hub id (owner/name).")
    else:
        path = _hub_file(model, name)
    try:
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
    except (ValueError, UnicodeDecodeError) as exc:  # JSONDecodeError is a ValueError
        raise ConfigError(f"{path} is not valid JSON ({exc}): restore it from the model's source, or pass another "
                          "--model.") from None
    except RecursionError:  # arrays or objects nested thousands deep: no config diffusers writes
        raise ConfigError(f"{path} nests its JSON deeper than Python's parser goes, which no diffusers config does: "
                          "restore it from the model's source, or pass another --model.") from None
    if not isinstance(data, dict):
        raise ConfigError(f"{path} holds a JSON {type(data).__name__}, not the object diffusers writes: restore it "
                          "from the model's source, or pass another --model.")
    return data


def _looks_like_path(model: str) -> bool:
    """Hub ids are `name` or `owner/name`; anything else is meant as a folder."""
    return os.path.isabs(model) or model.startswith((".", "~")) or model.count("/") > 1


def _hub_file(model: str, name: str) -> str:
    """The file from the Hub's local cache, or downloaded; fails within seconds when the Hub is unreachable."""
    try:
        from huggingface_hub import hf_hub_download, try_to_load_from_cache

        cached = try_to_load_from_cache(model, name)
    except Exception:  # noqa: BLE001 - e.g. an id the Hub would refuse; hf_hub_download says why below
        cached = None
    if isinstance(cached, str):
        return cached
    if not os.environ.get("HF_HUB_OFFLINE"):
        from .preflight import check_hub_reachable

        check_hub_reachable(model)
    try:
        return hf_hub_download(model, name)
    except Exception as exc:  # noqa: BLE001 - any failure means: not reachable
        raise ConfigError(
            f"model {model!r} was not found: it is not a local folder, and {name} could not be read from the "
            f"Hugging Face Hub or its local cache ({type(exc).__name__}). Pass a folder saved with "
            "save_pretrained, or download the model first (e.g. `hf download MODEL`).") from None


def read_safetensors_header(path: str, what: str | None = None) -> tuple[dict, int]:
    """(tensor name -> {dtype, shape, data_offsets}, header length) of a safetensors file, "__metadata__" left
    out; a ConfigError starting with `what` (default: the path) when the file is unreadable, cut short or its
    header is not a table of tensors."""
    what = what or path
    try:
        size = os.path.getsize(path)
        with open(path, "rb") as f:
            head = f.read(8)
            if len(head) < 8:
                raise ConfigError(f"{what}: not a safetensors file (shorter than its 8-byte header length)")
            (length,) = struct.unpack("<Q", head)
            if length > size - 8:
                raise ConfigError(f"{what}: corrupt or truncated safetensors file (header of {length} bytes, file "
                                  f"of {size})")
            header = json.loads(f.read(length))
    except OSError as exc:
        raise ConfigError(f"{what}: cannot read it: {exc}") from None
    except (ValueError, UnicodeDecodeError) as exc:  # JSONDecodeError is a ValueError
        raise ConfigError(f"{what}: corrupt safetensors header ({exc})") from None
    except RecursionError:
        raise ConfigError(f"{what}: corrupt safetensors header (JSON nested too deep)") from None
    if not isinstance(header, dict):
        raise ConfigError(f"{what}: corrupt safetensors header (not a table of tensors)")
    header.pop("__metadata__", None)
    return header, length


@dataclass(frozen=True)
class Field:
    """What a numeric config field may hold: a number in low..high (whole: an integer, or a float with an integral
    value, as some configs write 4.0), or with `items` a list of them (patch_size [1, 2, 2]) or one; `flags`: a list
    of true/false (temperal_downsample). null counts as absent."""
    low: float
    high: float
    whole: bool = True
    required: bool = False
    items: bool = False
    flags: bool = False
    max_items: int = 16


def config_path(model: str, name: str) -> str:
    """How a message names a config file: its path in a folder, else the Hub id and the file."""
    return os.path.join(model, name) if os.path.isdir(model) else f"{model}: {name}"


def check_fields(config: dict, fields: dict[str, Field], where: str) -> None:
    """Each field of `fields` in `config` has the type and range diffusers writes there, else a ConfigError naming
    the file, the field and its value: a hostile or corrupt config gets a message before anything sizes a table,
    loops over blocks or converts to float from it. where: the file (config_path)."""
    fix = "restore the file from the model's source, or pass another --model"
    for key, rule in fields.items():
        value = config.get(key)
        if value is None:
            if rule.required:
                raise ConfigError(f"{where} has no {key}, which meshdit needs to plan and check the model: {fix}.")
            continue
        values = value if isinstance(value, list) and (rule.items or rule.flags) else [value]
        if rule.flags:
            ok = isinstance(value, list) and all(isinstance(v, bool) for v in values)
        else:
            ok = all(_in_range(v, rule) for v in values)
        if not ok or len(values) > rule.max_items or (rule.items and not values):
            raise ConfigError(f"{where}: {key} is {_shown(value)}; meshdit takes {_expected(rule)} there: {fix}.")


def _in_range(value, rule: Field) -> bool:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return False
    if isinstance(value, float) and (not math.isfinite(value) or (rule.whole and not value.is_integer())):
        return False
    return rule.low <= value <= rule.high


def _expected(rule: Field) -> str:
    if rule.flags:
        return f"a list of at most {rule.max_items} true/false values"
    low, high = (int(x) if float(x).is_integer() else x for x in (rule.low, rule.high))
    number = f"{'a whole number' if rule.whole else 'a number'} in {low}..{high}"
    return f"{number} (or a list of at most {rule.max_items} of them)" if rule.items else number


def _shown(value) -> str:
    text = repr(value)
    return text if len(text) <= 40 else f"{text[:30]}... ({len(text)} characters)"
