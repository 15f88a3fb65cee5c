"""`--layout auto`: the planner's layout for the world this run gets (generate, serve, the Python API).

The world: `--ranks N`, else torchrun's (WORLD_SIZE over LOCAL_WORLD_SIZE per node), else the visible GPUs, else
one CPU rank. Degrees above 1 given beside `--layout auto` are kept (explicit degrees win) and the planner fills
the rest. No torch unless the visible GPUs must be counted or sized."""
from __future__ import annotations

import os
from dataclasses import replace

from ..config import GenerateRequest, ParallelConfig
from ..engine_settings import EngineSettings
from ..errors import ConfigError
from ..mesh_axes import MeshAxis
from .choose import auto_config
from .hardware import CPU_HERE, MAX_RANKS, PRESETS, UNCALIBRATED_NOTE, World, world_from
from .predict import Prediction

LAYOUTS = ("auto",)


def _torchrun_world() -> tuple[int, int] | None:
    """(ranks per node, nodes) of the torchrun world this process is a rank of, if any."""
    if "WORLD_SIZE" not in os.environ or "RANK" not in os.environ:
        return None
    world = int(os.environ["WORLD_SIZE"])
    local = int(os.environ.get("LOCAL_WORLD_SIZE") or world)
    return local, max(1, world // local)


def visible_gpus() -> tuple[int, int, str]:
    """(count, memory bytes of the first, its name) of the GPUs torch sees; (0, 0, "") on a machine without."""
    import torch

    if not torch.cuda.is_available():
        return 0, 0, ""
    props = torch.cuda.get_device_properties(0)
    return torch.cuda.device_count(), int(props.total_memory), props.name


def preset_for(name: str) -> str:
    lowered = name.lower()
    for key, preset in (("h200", "h200"), ("h100", "h100-sxm"), ("mi300", "mi300x"), ("r9700", "r9700-pcie")):
        if key in lowered:
            return preset
    return "h100-sxm"  # another GPU: H100's throughput and links with its own memory (docs/planner.md)


def auto_world(ranks: int | None) -> World:
    """The world --layout auto plans for."""
    if ranks is not None and (not isinstance(ranks, int) or isinstance(ranks, bool) or not 1 <= ranks <= MAX_RANKS):
        raise ConfigError(f"--ranks must be a whole number >= 1 (at most {MAX_RANKS}), got {ranks!r}.")
    torchrun = _torchrun_world()
    if torchrun is not None:
        per_node, nodes = torchrun
        if ranks is not None and ranks != per_node * nodes:
            raise ConfigError(f"--ranks {ranks} but torchrun started {per_node * nodes} ranks: drop --ranks "
                              "(under torchrun the world is torchrun's).")
    count, memory, name = visible_gpus() if os.environ.get("MESHDIT_PLAN_DEVICE") != "cpu" else (0, 0, "")
    if torchrun is None:
        per_node, nodes = (ranks or max(count, 1)), 1
    if count == 0:
        return world_from(CPU_HERE, per_node, nodes)
    return replace(world_from(preset_for(name), per_node, nodes), memory_bytes=float(memory))


def fixed_degrees(config: ParallelConfig) -> dict[MeshAxis, int]:
    """The degrees given beside --layout auto (those above 1): the planner keeps them."""
    return {axis: degree for axis, degree in config.degrees.items() if degree > 1}


def resolve_auto(engine: EngineSettings, request: GenerateRequest, ranks: int | None,
                 world: World | None = None) -> tuple[EngineSettings, Prediction]:
    """The engine settings with the planner's degrees (and its parallel VAE decode, and the text encoders on the
    host where it needs them, unless set otherwise), and the prediction for that layout."""
    world = world or auto_world(ranks)
    fixed = fixed_degrees(engine.config)
    config, chosen = auto_config(engine.model, request, world, compile=engine.config.compile, fixed=fixed)
    vae = engine.vae
    if chosen.layout.vae == "parallel" and not (vae.parallel or vae.tiled):
        vae = replace(vae, parallel=True)
    loading = engine.loading
    if chosen.layout.text_on_cpu and loading.text_encoder_device is None:
        loading = replace(loading, text_encoder_device="cpu")
    if chosen.layout.text_parallel:
        loading = replace(loading, text_encoder_parallel=True)
    if chosen.layout.offload:
        loading = replace(loading, offload="blocks")
    return replace(engine, config=config, vae=vae, loading=loading), chosen


def layout_from_flags(args, engine: EngineSettings, request: GenerateRequest
                      ) -> tuple[EngineSettings, Prediction | None]:
    """--layout and --ranks (generate and serve): the planner's settings under --layout auto, else as given."""
    if getattr(args, "layout", None) == "auto":
        return resolve_auto(engine, request, args.ranks)
    if getattr(args, "ranks", None) is not None:
        raise ConfigError("--ranks sets the world --layout auto plans for: add --layout auto, or drop --ranks "
                          "(without it the degrees give the world size).")
    return engine, None


def describe_choice(engine: EngineSettings, prediction: Prediction) -> str:
    """One line for the summary: what --layout auto chose and what the planner predicts for it."""
    calibrate = "" if prediction.calibrated else f"; {UNCALIBRATED_NOTE}"
    return (f"--layout auto chose {engine.config.describe()} ({prediction.layout.flags() or 'serial'}) for "
            f"{prediction.layout.world_size} rank(s): predicted {prediction.total_s:.2f} s end to end, "
            f"{prediction.memory.peak / 1e9:.2f} GB peak per rank (docs/planner.md){calibrate}")


def plan_layout(model: str, request: GenerateRequest | None = None, ranks: int | None = None,
                world: World | None = None) -> ParallelConfig:
    """The Python API's --layout auto: the planner's ParallelConfig for `model` (a folder, Hub id or snapshot
    name) and `request` (default: the model's defaults) on `ranks` ranks (default as `--ranks`)."""
    config, _ = auto_config(model, request or GenerateRequest(prompt="-"), world or auto_world(ranks))
    return config


__all__ = ["LAYOUTS", "PRESETS", "auto_world", "plan_layout", "resolve_auto"]
