"""LoRA adapters on a rank's pipeline through diffusers' own loader (PEFT layers beside the base Linear layers).

Each adapter loads once, when the engine is built (before any parallel hook, so a hook on a Linear layer's output
sees the adapted output); requests switch between loaded adapters with `set_adapters`, never reloading the model.
Under PipeFusion a stage loads only the adapter tensors of the blocks it keeps (`keep`, loading/stages.py).
"""
from __future__ import annotations

import logging
import warnings
from typing import Callable

from ..errors import ConfigError
from ..lora_files import PEFT_KEY_PARTS, check_pipeline_takes_lora  # noqa: F401 - the engine's check

TRANSFORMER_PREFIX = "transformer."
FIRST_EXPERT, SECOND_EXPERT = "transformer", "transformer_2"  # Wan 2.2: high-noise, low-noise expert


def check_linears_not_quantized(pipe) -> None:
    """peft wraps nn.Linear layers only, so adapters load before FP8 GEMMs quantize them (the engine's order: the
    FP8 Linear then sits under peft's layer as its base layer). A pipeline handed over already quantized is refused."""
    from ..quant.fp8_linear import Fp8Linear

    for name in ("transformer", "transformer_2"):
        denoiser = getattr(pipe, name, None)
        if denoiser is not None and any(isinstance(m, Fp8Linear) for m in denoiser.modules()):
            raise ConfigError(f"--lora: this pipeline's {name} already has FP8 Linear layers, which LoRA adapters "
                              "cannot wrap: load it without FP8 GEMMs and pass the Fp8Config to the Engine, which "
                              "quantizes after the adapters load")


def diffusers_version() -> str:
    import diffusers

    return diffusers.__version__


def load_adapter(pipe, name: str, path: str, keep: Callable[[str], bool] | None = None,
                 experts: tuple[str, ...] = (FIRST_EXPERT,)) -> int:
    """Loads the adapter file `path` as `name` into the denoisers `experts` ("transformer", and Wan 2.2's second
    expert "transformer_2": diffusers' load_into_transformer_2; the file's tensors are named `transformer.*` for
    either). keep(transformer tensor name): False drops a tensor (another PipeFusion stage's block; both experts are
    cut alike). Returns how many of its tensors are held here: 0 when none (every tensor another stage's).
    A failed load leaves the pipeline as it was (no half-applied adapter) and raises ConfigError naming the file."""
    check_pipeline_takes_lora(pipe)
    for expert in experts:
        if getattr(pipe, expert, None) is None:
            raise ConfigError(f"--lora-2 {path!r}: this {type(pipe).__name__} has no second expert ({expert}); "
                              "only Wan 2.2's two-expert models have one: use --lora")
    try:
        state = pipe.lora_state_dict(path)  # converts kohya / xlabs formats where diffusers knows them
        if isinstance(state, tuple):  # some mixins return (state, network_alphas, ...)
            state = state[0]
    except Exception as exc:  # diffusers raises ValueError, OSError, safetensors' own errors
        raise ConfigError(f"--lora {path!r}: cannot read the adapter: {exc}") from None
    check_finite(state, path)
    if keep is not None:
        state = {k: v for k, v in state.items()
                 if not k.startswith(TRANSFORMER_PREFIX) or keep(k.removeprefix(TRANSFORMER_PREFIX))}
    if not state:
        return 0
    for expert in experts:
        check_fits(getattr(pipe, expert), state, path)
    before = list_adapters(pipe)
    try:
        with _quiet_diffusers():
            for expert in experts:
                second = {"load_into_transformer_2": True} if expert == SECOND_EXPERT else {}
                pipe.load_lora_weights(state, adapter_name=name, **second)
    except Exception as exc:
        remove_adapters(pipe, [name] if name not in before else [])
        raise ConfigError(f"--lora {path!r}: diffusers could not load it into {type(pipe).__name__}: {exc}") from None
    return len(state)


def check_finite(state: dict, path: str) -> None:
    """An adapter tensor holding NaN or inf would turn every image it touches into NaN: refused, naming it."""
    import torch

    for key, tensor in state.items():
        if torch.is_tensor(tensor) and tensor.is_floating_point() and not bool(torch.isfinite(tensor).all()):
            raise ConfigError(f"--lora {path!r}: tensor {key!r} holds NaN or infinite values, which would turn the "
                              "image into NaN: this adapter file is damaged (retrain or re-export it)")


def check_fits(transformer, state: dict, path: str) -> None:
    """Every transformer LoRA tensor (after diffusers' conversion) adapts a Linear layer of this model with its
    sizes: lora_A [r, in], lora_B [out, r]. Another model's adapter is refused naming the file and tensor."""
    modules = dict(transformer.named_modules())
    for key, tensor in state.items():
        if not key.startswith(TRANSFORMER_PREFIX) or not any(p in key for p in PEFT_KEY_PARTS):
            continue
        module_name, part = key.removeprefix(TRANSFORMER_PREFIX).split(".lora_", 1)
        module = modules.get(module_name)
        weight = getattr(module, "weight", None)
        if module is None or weight is None or weight.dim() != 2:
            raise ConfigError(f"--lora {path!r}: tensor {key!r} adapts {module_name!r}, which the model has no "
                              "Linear layer of: this adapter was made for another model")
        if tensor.dim() != 2 or (part.startswith("A") and tensor.shape[1] != weight.shape[1]) or \
                (part.startswith("B") and tensor.shape[0] != weight.shape[0]):
            raise ConfigError(f"--lora {path!r}: tensor {key!r} has shape {list(tensor.shape)}, which does not fit "
                              f"{module_name!r} of shape {list(weight.shape)}: this adapter was made for another "
                              "model")


def remove_adapters(pipe, names: list[str]) -> None:
    """Takes `names` out again; when no adapter is left, diffusers puts the model's own Linear layers back
    (unload_lora_weights), so the pipeline is as loaded. The base weights are never touched."""
    loaded = list_adapters(pipe)
    if not loaded - set(names):
        pipe.unload_lora_weights()
    elif names:
        pipe.delete_adapters([n for n in names if n in loaded])


def list_adapters(pipe) -> set[str]:
    """Every adapter name loaded into any of the pipeline's components."""
    return {n for names in pipe.get_list_adapters().values() for n in names}


def activate(pipe, loras: tuple[tuple[str, float], ...], held: set[str]) -> None:
    """Makes exactly `loras` ((name, weight), loaded) active; () turns LoRA off (the base model's own output).
    Names not held on this rank (another stage's blocks only) are left out here."""
    here = [(n, w) for n, w in loras if n in held]
    if not here:
        if held:
            pipe.disable_lora()
        return
    pipe.enable_lora()
    pipe.set_adapters([n for n, _ in here], [w for _, w in here])


def adapter_bytes(module) -> int:
    """Bytes of LoRA parameters a module holds (benchmarks/lora.py: per PipeFusion stage)."""
    return sum(p.numel() * p.element_size() for n, p in module.named_parameters() if ".lora_" in n)


class _quiet_diffusers:
    """diffusers warns for each component an adapter has no keys for (the text encoders), peft for every adapter
    after the first; neither is news to a user who asked for several adapters."""

    def __enter__(self):
        self._logger = logging.getLogger("diffusers")
        self._level = self._logger.level
        self._logger.setLevel(logging.ERROR)
        self._warnings = warnings.catch_warnings()
        self._warnings.__enter__()
        warnings.filterwarnings("ignore", message="Already found a `peft_config`")

    def __exit__(self, *exc):
        self._warnings.__exit__(*exc)
        self._logger.setLevel(self._level)
