"""How heavy a request is, estimated before any rank starts from config files and safetensors headers
(no torch, no weights read): its work against the model's own default request, and its memory against
what this machine has available. The CLI prints a warning, never a refusal: the estimate is rough
(arithmetic of the model's shapes, not a measurement) and the user may know better.
"""
from __future__ import annotations

import glob
import os
from dataclasses import dataclass

from .config import GenerateRequest, ParallelConfig
from .config_files import read_json, read_safetensors_header
from .errors import ConfigError

WORK_WARNING_RATIO = 50.0
"""A request with this many times the work of the model's default request gets a warning."""
MEMORY_WARNING_SHARE = 0.9
"""A request whose estimated memory exceeds this share of the available memory gets a warning."""
ACTIVATION_COPIES = 12
"""Token activations a transformer block holds at once, in units of tokens x hidden size (inputs,
q/k/v, attention output, the MLP's hidden layer of 4 x hidden): a rough count, not a measurement."""
DECODE_COPIES = 3
"""Full-resolution feature maps a VAE decoder holds at once (input, output, residual)."""
GIB = 2 ** 30

_SAFETENSORS_BYTES = {"F64": 8, "F32": 4, "F16": 2, "BF16": 2, "I64": 8, "I32": 4, "I16": 2, "I8": 1, "U8": 1,
                      "BOOL": 1, "F8_E4M3": 1, "F8_E5M2": 1}


@dataclass(frozen=True)
class RequestCost:
    tokens: int             # image tokens of one image (every frame of a video)
    default_tokens: int     # the same at the model's default size
    work_ratio: float       # this request's transformer work / the default request's (one image)
    memory_bytes: int       # estimated peak on this machine (CPU) or on one device (GPU)
    available_bytes: int | None
    decode_bytes: int       # the VAE decode's share of memory_bytes
    where: str              # "RAM" or "GPU memory"

    @property
    def too_much_work(self) -> bool:
        return self.work_ratio >= WORK_WARNING_RATIO

    @property
    def too_much_memory(self) -> bool:
        return self.available_bytes is not None and self.memory_bytes > MEMORY_WARNING_SHARE * self.available_bytes


def transformer_parameters(model: str, transformer_config: dict) -> tuple[int, int]:
    """(parameters, bytes per parameter as stored) of the transformer: from its safetensors headers when the
    folder has them, else from the config (12 x hidden^2 per block, the weights of attention and a 4x MLP)."""
    files = sorted(glob.glob(os.path.join(model, "transformer", "*.safetensors")))
    total = stored = 0
    for path in files:
        try:
            header, _ = read_safetensors_header(path)
        except ConfigError:  # the loading reports a bad file; the estimate falls back to the config
            break
        for name, meta in header.items():
            if not isinstance(meta, dict):
                continue
            count = 1
            for d in meta.get("shape", []):
                count *= int(d)
            total += count
            stored += count * _SAFETENSORS_BYTES.get(meta.get("dtype"), 4)
    else:
        if total:
            return total, max(1, round(stored / total))
    hidden, blocks = _hidden_and_blocks(transformer_config)
    return 12 * hidden * hidden * blocks, 2


def _hidden_and_blocks(config: dict) -> tuple[int, int]:
    hidden = int(config.get("num_attention_heads", 1)) * int(config.get("attention_head_dim", 64))
    blocks = sum(int(config.get(k) or 0) for k in ("num_layers", "num_single_layers", "num_refiner_layers")) or 1
    return hidden, blocks


def _step_work(tokens: int, params: int, hidden: int, blocks: int) -> float:
    """FLOPs of one transformer call on one image: the linear layers, and attention (square in the tokens)."""
    return 2.0 * params * tokens + 4.0 * blocks * hidden * float(tokens) ** 2


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


def estimate(model: str, info, config: ParallelConfig, request: GenerateRequest, vae, dtype: str | None,
             device_type: str | None = None, available: int | None = -1) -> RequestCost:
    """The cost of `request` (defaults filled in) on `config`'s layout. `available` -1: read it here."""
    device_type = device_type or ("cuda" if gpu_visible() else "cpu")
    defaults = info.request_defaults()
    frames = info.latent_frames(request.num_frames)
    tokens = frames * info.family.image_tokens(request.height, request.width, info.transformer_config,
                                               info.vae_scale_factor)
    default_frames = info.latent_frames(defaults.num_frames)
    default_tokens = default_frames * info.family.image_tokens(defaults.height, defaults.width,
                                                               info.transformer_config, info.vae_scale_factor)
    text = int(request.extra.get("max_sequence_length") or 0)
    params, _ = transformer_parameters(model, info.transformer_config)
    hidden, blocks = _hidden_and_blocks(info.transformer_config)
    images = len(request.prompts) * request.num_images_per_prompt
    work = _step_work(tokens + text, params, hidden, blocks) * request.num_inference_steps * images
    default_work = _step_work(default_tokens + defaults.max_sequence_length, params, hidden, blocks) * defaults.steps
    value_bytes = {"float32": 4, "bfloat16": 2, "float16": 2}.get(dtype or "", 2 if device_type == "cuda" else 4)
    weights = params * value_bytes
    # every rank holds its share of the tokens (sequence parallelism) of its share of the batch (data parallelism)
    batch = max(1, -(-images // config.data_parallel_degree))
    per_rank = (tokens + text) // config.sp_degree * hidden * value_bytes * ACTIVATION_COPIES * batch
    decode = _decode_bytes(model, request, frames, vae, config)
    if device_type == "cuda":   # one device: its rank's weights (PipeFusion: its stage's), activations, decode
        memory = weights // config.pipefusion_parallel_degree + per_rank + decode
    else:                       # one machine: the weights once (ranks share them on a CPU), every rank's work
        memory = weights + per_rank * config.world_size + decode
    avail = available_memory(device_type) if available == -1 else available
    return RequestCost(tokens, default_tokens, work / default_work, memory, avail, decode,
                       "GPU memory" if device_type == "cuda" else "RAM")


def _decode_bytes(model: str, request: GenerateRequest, frames: int, vae, config: ParallelConfig) -> int:
    """Peak of the VAE decoder's last, full-resolution layers (float32): the tile, or this rank's band."""
    try:
        channels = max(int(c) for c in read_json(model, "vae/config.json").get("block_out_channels") or [128])
    except (ConfigError, ValueError, TypeError):
        channels = 128
    height = min(request.height, vae.tile_height) if vae is not None and vae.tile_height else request.height
    width = min(request.width, vae.tile_width) if vae is not None and vae.tile_width else request.width
    bands = config.sp_degree * config.pipefusion_parallel_degree if vae is not None and vae.parallel else 1
    return height * width * max(frames, 1) * channels * 4 * DECODE_COPIES // bands


def warning(cost: RequestCost, request: GenerateRequest, defaults) -> str | None:
    """The CLI's warning for a heavy request (naming the estimate and what to change), or None."""
    if not (cost.too_much_work or cost.too_much_memory):
        return None
    size = f"{request.height}x{request.width}"
    default = f"{defaults.height}x{defaults.width}"
    parts = []
    if cost.too_much_work:
        parts.append(f"{size} is {cost.tokens:,} image tokens (the model's default {default}: "
                     f"{cost.default_tokens:,}); with {request.num_inference_steps} steps this is about "
                     f"{cost.work_ratio:,.0f} times the work of one default image (attention grows with the square "
                     "of the tokens), so it may take very long")
    if cost.too_much_memory:
        decode = f", {cost.decode_bytes / GIB:.1f} GiB of it for the VAE decode" if cost.decode_bytes else ""
        parts.append(f"it needs about {cost.memory_bytes / GIB:.1f} GiB of {cost.where}{decode}, more than the "
                     f"{cost.available_bytes / GIB:.1f} GiB available, so it may fail or be killed")
    fixes = [f"a smaller --height/--width (the model's default is {default})"]
    if cost.too_much_work:
        fixes.append(f"fewer --steps (now {request.num_inference_steps})")
        fixes.append("more ranks on more devices (--ulysses-degree, --ring-degree)")
    if cost.too_much_memory and cost.decode_bytes > cost.memory_bytes / 4:
        fixes.append("a tiled decode (--vae-tile-height 1024 --vae-tile-width 1024) or --use-parallel-vae")
    return f"this request is heavy: {'; and '.join(parts)}. To lighten it: {', '.join(fixes)}."
