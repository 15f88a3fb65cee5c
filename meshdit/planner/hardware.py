"""The world a layout runs on: GPUs per node, nodes, memory per GPU, compute throughput and the links' alpha-beta
figures; presets for common machines and this machine's CPU ranks (from `meshdit plan --calibrate`). Where each
preset's figures come from is in docs/planner.md."""
from __future__ import annotations

import json
import os
import re
from dataclasses import asdict, dataclass, replace

from ..errors import ConfigError

GiB = 1024 ** 3


@dataclass(frozen=True)
class Link:
    latency_s: float
    """alpha: seconds per message."""
    bandwidth: float
    """beta^-1: bytes per second one rank sends over it."""

    def seconds(self, messages: float, nbytes: float) -> float:
        return messages * self.latency_s + nbytes / self.bandwidth


@dataclass(frozen=True)
class World:
    name: str
    gpus_per_node: int
    nodes: int
    memory_bytes: float
    """Per rank (GPU memory, or this rank's share of host memory)."""
    flops: float
    """Sustained dense matmul throughput per rank at the working dtype, FLOP/s."""
    fp8_flops: float
    """The same with FP8 GEMMs (equal to flops where the device has no FP8 arithmetic)."""
    intra: Link
    inter: Link
    attention_flops: float = 0.0
    """Sustained throughput of the attention kernels (0: as `flops`)."""
    dtype_bytes: int = 2
    host_link_bps: float = 25e9
    """Host-to-device copy bandwidth per rank (pinned memory over PCIe): what --offload blocks streams over."""
    launch_s: float = 20e-6
    """Fixed cost of one small operator call per rank (a kernel launch, Python): a block makes
    predict.CALLS_PER_BLOCK of them."""

    @property
    def size(self) -> int:
        return self.gpus_per_node * self.nodes

    @property
    def shares_host_memory(self) -> bool:
        """CPU ranks: one host's memory, and one mapped copy of the weights however many ranks (lean loading)."""
        return self.name == CPU_HERE

    def with_size(self, gpus_per_node: int, nodes: int = 1) -> "World":
        memory = self.memory_bytes * self.gpus_per_node / gpus_per_node if self.shares_host_memory else \
            self.memory_bytes
        return replace(self, gpus_per_node=gpus_per_node, nodes=nodes, memory_bytes=memory)


def _gpu(name: str, memory_gb: float, tflops: float, fp8_tflops: float, intra_gbps: float, inter_gbps: float,
         intra_latency: float = 10e-6, inter_latency: float = 20e-6, efficiency: float = 0.6,
         attention_efficiency: float = 0.33) -> World:
    """efficiency, attention_efficiency: the shares of the datasheet's dense throughput an eager DiT step's
    matmuls and attention kernels sustain, fitted to the published H100 figures (docs/planner.md, "Presets")."""
    return World(name, 1, 1, memory_gb * 1e9, tflops * 1e12 * efficiency, fp8_tflops * 1e12 * efficiency,
                 Link(intra_latency, intra_gbps * 1e9), Link(inter_latency, inter_gbps * 1e9),
                 attention_flops=tflops * 1e12 * attention_efficiency)


PRESETS: dict[str, World] = {
    # datasheet figures (docs/planner.md, "Presets"); intra: NVLink / Infinity Fabric / PCIe per GPU and direction,
    # inter: one 400 Gb/s NIC per GPU
    "h100-sxm": _gpu("h100-sxm", 80, 989, 1979, 450, 50),
    "h200": _gpu("h200", 141, 989, 1979, 450, 50),
    "mi300x": _gpu("mi300x", 192, 1307, 2615, 64, 50),
    "r9700-pcie": _gpu("r9700-pcie", 32, 96, 191, 16, 12, intra_latency=20e-6),
}
CPU_HERE = "cpu-here"
PRESET_NAMES = tuple(PRESETS) + (CPU_HERE,)

CALIBRATION_ENV = "MESHDIT_CALIBRATION"


def calibration_path() -> str:
    """Where `meshdit plan --calibrate` saves this machine's figures."""
    if os.environ.get(CALIBRATION_ENV):
        return os.environ[CALIBRATION_ENV]
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "meshdit", "calibration.json")


def cpu_here(ranks: int | None = None) -> World:
    """This machine's CPU ranks (float32, gloo over loopback), from the calibration file; uncalibrated defaults
    (a warning says so) where there is none."""
    data = load_calibration()
    cores = os.cpu_count() or 1
    memory = _host_memory()
    flops = data.get("flops", 5e9) if data else 5e9
    link = Link(data.get("latency_s", 50e-6), data.get("bandwidth", 1e9)) if data else Link(50e-6, 1e9)
    ranks = ranks or 1
    return World(CPU_HERE, ranks, 1, memory / ranks, flops * min(1.0, cores / ranks), flops * min(1.0, cores / ranks),
                 link, link, dtype_bytes=4, launch_s=data.get("launch_s", 5e-6) if data else 5e-6)


def load_calibration() -> dict | None:
    path = calibration_path()
    if not os.path.isfile(path):
        return None
    try:
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
    except (OSError, ValueError) as exc:
        raise ConfigError(f"{path} cannot be read ({exc}): run `meshdit plan --calibrate` again, or delete it.") from None
    return data if isinstance(data, dict) else None


def save_calibration(figures: dict) -> str:
    """Writes the figures through a temp file and a rename (an interrupted run keeps the old file)."""
    path = calibration_path()
    os.makedirs(os.path.dirname(path), exist_ok=True)
    tmp = f"{path}.{os.getpid()}.tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(figures, f, indent=2)
    os.replace(tmp, path)
    return path


def _host_memory() -> float:
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):  # pragma: no cover - non-POSIX
        return 16 * GiB


_SIZE = re.compile(r"^\s*([0-9]*\.?[0-9]+)\s*([KMGT]i?B?)?\s*$", re.IGNORECASE)


def parse_bytes(text: str, flag: str) -> float:
    """'32GB', '32GiB', '80G', '24000MB' -> bytes (GB = 1e9, GiB = 2^30); a bare number is GB."""
    match = _SIZE.match(str(text))
    if not match:
        raise ConfigError(f"{flag} {text!r} is not a size: write it like 32GB, 80GiB or 24000MB.")
    value, unit = float(match.group(1)), (match.group(2) or "GB").upper()
    powers = {"K": 1, "M": 2, "G": 3, "T": 4}
    base = 1024 if "I" in unit else 1000
    return value * base ** powers[unit[0]]


def world_from(preset: str, gpus: int | None, nodes: int, memory: str | None = None,
               intra_gbps: float | None = None, inter_gbps: float | None = None) -> World:
    """A preset with the user's overrides; ConfigError naming the flag when a value is out of range."""
    if preset not in PRESET_NAMES:
        raise ConfigError(f"--preset {preset!r} is not one of {', '.join(PRESET_NAMES)}.")
    for flag, value in (("--gpus", gpus), ("--nodes", nodes)):
        if value is not None and (not isinstance(value, int) or value < 1):
            raise ConfigError(f"{flag} must be a whole number >= 1, got {value!r}.")
    if preset == CPU_HERE:
        world = replace(cpu_here((gpus or 1) * nodes), gpus_per_node=gpus or 1, nodes=nodes)
    else:
        world = PRESETS[preset].with_size(gpus or 1, nodes)
    if memory is not None:
        world = replace(world, memory_bytes=parse_bytes(memory, "--gpu-memory"))
    for flag, value, attr in (("--intra-node-gbps", intra_gbps, "intra"), ("--inter-node-gbps", inter_gbps, "inter")):
        if value is not None:
            if value <= 0:
                raise ConfigError(f"{flag} must be > 0 GB/s, got {value}.")
            world = replace(world, **{attr: Link(getattr(world, attr).latency_s, value * 1e9)})
    return world


def describe(world: World) -> str:
    figures = asdict(world)
    return (f"{world.name}: {world.nodes} node(s) x {world.gpus_per_node} rank(s), "
            f"{world.memory_bytes / 1e9:.1f} GB per rank, {world.flops / 1e12:.3g} TFLOP/s sustained per rank, "
            f"links {figures['intra']['bandwidth'] / 1e9:.3g} GB/s inside a node, "
            f"{figures['inter']['bandwidth'] / 1e9:.3g} GB/s between nodes")
