"""How heavy a request is, before any rank starts, by the planner's cost model (planner/predict.py, docs/planner.md:
the same per-rank memory and time `meshdit plan` and `--layout auto` print) for the layout given, on this machine, from
config files alone (no torch unless the ranks run on GPUs). A request whose predicted memory exceeds what the ranks can
get (the planner's rule: 90% of the memory available now) is refused, naming the largest size that fits (`--force`
starts it anyway); one that will take very long gets a warning naming the predicted time.
"""
from __future__ import annotations

import os
from dataclasses import dataclass, replace

from .config import GenerateRequest
from .planner.predict import USABLE_MEMORY, predict

WORK_WARNING_RATIO = 50.0
"""A request with this many times the work of the model's default request gets a warning."""
LONG_RUN_S = 600.0
"""A request predicted to take longer than this (end to end) gets a warning, whatever its work ratio."""
GIB = 2 ** 30
GB = 1e9
_DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}


@dataclass(frozen=True)
class RequestCost:
    tokens: int             # image tokens of one image (every frame of a video)
    default_tokens: int     # the same at the model's default size
    work_ratio: float       # this request's transformer FLOPs / the default request's (one image)
    memory_bytes: float     # the planner's need: one device's peak (GPU), this machine's (CPU ranks share its RAM)
    available_bytes: int | None
    decode_bytes: float     # the VAE decode's working set (per rank), of memory_bytes
    where: str              # "RAM" or "GPU memory"
    seconds: float          # the planner's predicted time end to end
    calibrated: bool        # the time is from measured figures (else `meshdit plan --calibrate` would improve it)
    largest_fitting: tuple[int, int] | None = None  # (height, width) of the same shape that fits, when this does not

    @property
    def too_much_work(self) -> bool:
        return self.work_ratio >= WORK_WARNING_RATIO or self.seconds >= LONG_RUN_S

    @property
    def budget_bytes(self) -> float | None:
        """What the ranks may plan to use: the planner's share of the memory available now."""
        return None if self.available_bytes is None else USABLE_MEMORY * self.available_bytes

    @property
    def too_much_memory(self) -> bool:
        return self.budget_bytes is not None and self.memory_bytes > self.budget_bytes


def available_memory(device_type: str) -> int | None:
    """Bytes available now: /proc/meminfo's MemAvailable for the CPU, torch.cuda's free memory of device 0
    for a GPU; None where unknown."""
    if device_type == "cuda":
        try:
            import torch

            return int(torch.cuda.mem_get_info(0)[0])
        except Exception:  # noqa: BLE001 - no estimate rather than a failed run
            return None
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


def gpu_visible() -> bool:
    """Whether the ranks will run on GPUs, judged without importing torch where there is plainly none."""
    if os.environ.get("CUDA_VISIBLE_DEVICES", None) in ("", "-1"):
        return False
    if not (os.path.exists("/proc/driver/nvidia/gpus") or os.path.exists("/dev/kfd")):
        return False
    try:
        import torch

        return torch.cuda.is_available()
    except Exception:  # noqa: BLE001
        return False


def machine(device_type: str, ranks: int, dtype: str | None):
    """The planner's World for the ranks of this run: this machine's CPU ranks (its calibration, if any), or the GPU
    preset nearest the visible device; the engine's dtype where one is given."""
    from .planner.hardware import CPU_HERE, world_from

    if device_type == "cuda":
        import torch

        from .planner.auto import preset_for

        world = world_from(preset_for(torch.cuda.get_device_name(0)), ranks, 1)
    else:
        world = world_from(CPU_HERE, ranks, 1)
    return replace(world, dtype_bytes=_DTYPE_BYTES[dtype]) if dtype in _DTYPE_BYTES else world


def estimate(engine, info, request: GenerateRequest, device_type: str | None = None,
             available: int | None = -1) -> RequestCost:
    """The cost of `request` (defaults filled in) on `engine`'s layout (EngineSettings). `available` -1: read it
    here."""
    from .planner.layouts import layout_of
    from .planner.model_costs import costs_of

    planned_on_cpu = os.environ.get("MESHDIT_PLAN_DEVICE") == "cpu"  # as --layout auto plans (planner/auto.py)
    device_type = device_type or ("cuda" if not planned_on_cpu and gpu_visible() else "cpu")
    from .request import resolve_request

    defaults = info.request_defaults()
    request = resolve_request(request, info)  # as given, when the CLI resolved it
    costs = costs_of(engine.model, info)
    world = machine(device_type, engine.config.world_size, engine.dtype)
    layout = layout_of(engine)
    predicted = predict(layout, costs, world, request)
    avail = available_memory(device_type) if available == -1 else available
    work = _flops(costs, request.height, request.width, request.num_frames, request.extra["max_sequence_length"],
                  request.num_inference_steps)
    default_work = _flops(costs, defaults.height, defaults.width, defaults.num_frames, defaults.max_sequence_length,
                          defaults.steps)
    cost = RequestCost(costs.tokens(request.height, request.width, request.num_frames),
                       costs.tokens(defaults.height, defaults.width, defaults.num_frames), work / default_work,
                       predicted.node_bytes, avail, predicted.memory.vae,
                       "GPU memory" if device_type == "cuda" else "RAM", predicted.total_s, predicted.calibrated)
    if cost.too_much_memory:
        cost = replace(cost, largest_fitting=largest_fitting_size(info, costs, world, layout, request,
                                                                  cost.budget_bytes))
    return cost


def _flops(costs, height: int, width: int, frames: int | None, text_tokens: int, steps: int) -> float:
    """Transformer FLOPs of one image's denoising, every step (the planner's step_flops)."""
    linear, attention = costs.step_flops(costs.tokens(height, width, frames), int(text_tokens), 1)
    return (linear + attention) * steps


def largest_fitting_size(info, costs, world, layout, request: GenerateRequest, budget: float
                         ) -> tuple[int, int] | None:
    """The largest (height, width) of the request's shape, in multiples of the model's pixel multiple, whose
    predicted need fits `budget`; None when not even the smallest does (the weights alone are too many)."""
    multiple = info.family.pixel_multiple(info.transformer_config, info.vae_scale_factor)
    aspect = request.width / request.height

    def size(k: int) -> tuple[int, int]:
        return k * multiple, max(multiple, round(k * aspect) * multiple)

    def fits(k: int) -> bool:
        height, width = size(k)
        return predict(layout, costs, world, replace(request, height=height, width=width)).node_bytes <= budget

    low, high = 1, max(1, request.height // multiple)  # fits(high) is False: the request itself
    if not fits(low):
        return None
    while high - low > 1:
        middle = (low + high) // 2
        low, high = (middle, high) if fits(middle) else (low, middle)
    return size(low)


def duration(seconds: float) -> str:
    if seconds < 120:
        return f"{seconds:.0f} s"
    if seconds < 7200:
        return f"{seconds / 60:.0f} min"
    if seconds < 3 * 86400:
        return f"{seconds / 3600:.1f} h"
    return f"{seconds / 86400:,.0f} days"


def refusal(cost: RequestCost, request: GenerateRequest, defaults) -> str | None:
    """The CLI's refusal of a request whose predicted memory exceeds what the ranks can get, or None."""
    if not cost.too_much_memory:
        return None
    size = f"{request.height}x{request.width}"
    if cost.largest_fitting:
        height, width = cost.largest_fitting
        fit = f"the largest size of this shape that fits is --height {height} --width {width}"
    else:
        fit = "no size fits: the weights alone need more (free memory, or use a machine with more)"
    return (f"{size} needs about {_memory_text(cost)}, more than {_budget_text(cost)}, so it would fail or be "
            f"killed: {fit}; {_memory_fixes(cost, defaults)}; or pass --force to start it anyway.")


def warning(cost: RequestCost, request: GenerateRequest, defaults) -> str | None:
    """The CLI's warning for a request that will take very long, or (under --force) needs more memory than the
    ranks can get: the prediction and what to change; None for neither."""
    if not (cost.too_much_work or cost.too_much_memory):
        return None
    size = f"{request.height}x{request.width}"
    default = f"{defaults.height}x{defaults.width}"
    parts = []
    if cost.too_much_work:
        calibrate = "" if cost.calibrated else " (this machine is uncalibrated: `meshdit plan --calibrate` makes " \
                                               "the figure closer)"
        parts.append(f"{size} is {cost.tokens:,} image tokens (the model's default {default}: "
                     f"{cost.default_tokens:,}); with {request.num_inference_steps} steps this is about "
                     f"{cost.work_ratio:,.0f} times the work of one default image (attention grows with the square "
                     f"of the tokens), predicted to take {duration(cost.seconds)}{calibrate}")
    if cost.too_much_memory:
        parts.append(f"it needs about {_memory_text(cost)}, more than {_budget_text(cost)}, so it may fail or be "
                     "killed")
    fixes = [f"a smaller --height/--width (the model's default is {default})"]
    if cost.too_much_work:
        fixes.append(f"fewer --steps (now {request.num_inference_steps})")
        fixes.append("more ranks on more devices (--ulysses-degree, --ring-degree)")
    if cost.too_much_memory:
        fixes.append(_memory_fixes(cost, defaults))
    return f"this request is heavy: {'; and '.join(parts)}. To lighten it: {', '.join(fixes)}."


def _memory_text(cost: RequestCost) -> str:
    decode = f", {cost.decode_bytes / GB:.1f} GB of it for the VAE decode" if cost.decode_bytes else ""
    return f"{cost.memory_bytes / GB:.1f} GB of {cost.where} (the planner's prediction{decode})"


def _budget_text(cost: RequestCost) -> str:
    return (f"the {cost.budget_bytes / GB:.1f} GB a run may plan on ({USABLE_MEMORY:.0%} of the "
            f"{cost.available_bytes / GB:.1f} GB available now: the planner's rule, docs/planner.md)")


def _memory_fixes(cost: RequestCost, defaults) -> str:
    if cost.decode_bytes > cost.memory_bytes / 4:
        return "a tiled decode (--vae-tile-height 1024 --vae-tile-width 1024) or --use-parallel-vae over more ranks"
    return f"a smaller --height/--width (the model's default is {defaults.height}x{defaults.width})"
