"""The world a layout runs on: GPUs per node, nodes, memory per GPU, compute throughput and the links' alpha-beta
figures; presets for common machines and this machine's CPU ranks (from `meshdit plan --calibrate`). Where each
preset's figures come from is in docs/planner.md."""
from __future__ import annotations

import json
import math
import os
import re
from dataclasses import asdict, dataclass, replace

from ..errors import ConfigError

GiB = 1024 ** 3
MAX_RANKS = 4096
"""The largest world `meshdit plan` and --layout auto plan for."""
MAX_LINK_GBPS = 1e5
"""GB/s per rank: 100 TB/s, far above any link; a larger figure is a typo."""
MEMORY_RANGE = (1e6, 1e15)
"""Bytes per rank --gpu-memory takes: 1 MB to 1 PB."""


@dataclass(frozen=True)
class Link:
    latency_s: float
    """alpha: seconds per message."""
    bandwidth: float
    """beta^-1: bytes per second one rank sends over it."""

    def seconds(self, messages: float, nbytes: float) -> float:
        return messages * self.latency_s + nbytes / self.bandwidth


@dataclass(frozen=True)
class Collectives:
    """Measured cost of each collective a layout issues, at one world size, while the ranks compute between calls
    (`meshdit plan --calibrate` on CPU ranks: a wait there costs a wake-up or, with more ranks than cores, the
    peer's turn on a core, far above an idle ping-pong's latency). latency_s is per call; bandwidth counts the bytes
    one rank sends (an exchange: its block; an all-to-all: all but its own share; an all-reduce: 2(n-1)/n of it)."""
    exchange: Link
    """Send to one rank and receive from another (PipeFusion's patch hand-off, the VAE's halo rows)."""
    all_to_all: Link
    all_reduce: Link
    ulysses_attention: Link
    """One Ulysses attention call (its two all-to-alls, packing and unpacking): meshdit's own function, timed."""
    ring_step: Link
    """One step of a ring attention call (the K/V hop, the partial attention with its LSE, the merge)."""
    pipefusion_hop: Link | None = None
    """One patch's hand-off to the next PipeFusion stage inside a patch step; None: as `exchange`."""
    parallel_decode: Link | None = None
    """A parallel decode's fixed cost per image (latency_s: its band plan and hooks, the halo exchanges and norm
    all-reduces of every layer, measured on a small image, where they are all it adds); None: per collective, as
    `exchange` and `all_reduce`."""


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
    cores: int = 0
    """CPU ranks: the cores they share (a rank computes at cores / ranks of its own speed when there are more
    ranks than cores); 0: a device per rank."""
    collectives: Collectives | None = None
    """Measured per-collective costs (cpu-here); None: the alpha-beta links above, per message of each algorithm."""
    conv_flops: tuple[tuple[int, float], ...] = ()
    """(channels, sustained FLOP/s) of a 3x3 convolution (the VAE decoder's); empty: as flops."""
    conv3d_flops: tuple[tuple[int, float], ...] = ()
    """The same for a 3x3x3 convolution (the video VAEs' causal ones); empty: as conv_flops."""
    norm_s_per_element: float = 0.0
    """Seconds per element of a VAE decoder's GroupNorm (and, the next, of a video VAE's RMS norm over channels):
    memory-bound passes that small-channel decoders spend as long in as in their convolutions; 0: left out."""
    norm3d_s_per_element: float = 0.0
    call_overhead_s: float = 0.0
    """Fixed cost of one transformer call beyond its blocks' operators (embedders, rotary tables, scheduler and
    pipeline bookkeeping), measured on the bundled model; 0 on the GPU presets (their fit absorbs it)."""
    generate_overhead_s: float = 0.0
    """Fixed cost of one generate beyond its text encoding, steps and decode (tokenizers, latents, image out)."""
    calibrated: bool = True
    """False: cpu-here without a calibration file, its rates the defaults (times can be several times off)."""

    def share(self, active_ranks: int) -> float:
        """The share of its own speed a rank gets while `active_ranks` ranks compute at once."""
        return min(1.0, self.cores / active_ranks) if self.cores else 1.0

    def conv_rate(self, channels: int, three_d: bool = False) -> float:
        """3x3 (three_d: 3x3x3) convolution throughput at `channels`: log-linear between the measured channel
        counts, the first segment's slope below them, the last count's rate above."""
        points = sorted((self.conv3d_flops if three_d else ()) or self.conv_flops)
        if not points:
            return self.flops
        if len(points) == 1:
            return points[0][1]
        for (c0, r0), (c1, r1) in zip(points, points[1:]):
            if channels <= c1 or (c1, r1) == points[-1]:
                w = math.log(max(channels, 1) / c0) / math.log(c1 / c0)
                return r0 * (r1 / r0) ** min(w, 1.0)  # below the first count, the first segment's slope

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
        if not self.shares_host_memory:
            return replace(self, gpus_per_node=gpus_per_node, nodes=nodes, memory_bytes=memory)
        measured = cpu_here(gpus_per_node * nodes)  # the collectives and fixed costs measured at that world size
        return replace(self, gpus_per_node=gpus_per_node, nodes=nodes, memory_bytes=memory,
                       collectives=measured.collectives, call_overhead_s=measured.call_overhead_s,
                       generate_overhead_s=measured.generate_overhead_s)


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


def cpu_here(ranks: int | None = None, data: dict | None = None) -> World:
    """This machine's CPU ranks (float32, gloo over loopback), from the calibration file (or `data`, figures of
    the same form); uncalibrated defaults (a warning says so) where there is none. Rates are one rank's alone;
    predict.py applies World.share."""
    data = (load_calibration() or {}) if data is None else data
    calibrated = bool(data)
    cores = os.cpu_count() or 1
    memory = _host_memory()
    ranks = ranks or 1
    link = Link(data.get("latency_s", 50e-6), data.get("bandwidth", 1e9))
    flops = data.get("flops", 5e9)
    return World(CPU_HERE, ranks, 1, memory / ranks, flops, flops, link, link,
                 attention_flops=data.get("attention_flops", 0.0), dtype_bytes=4,
                 launch_s=data.get("launch_s", 5e-6), cores=cores, collectives=_collectives(data, ranks),
                 conv_flops=tuple(sorted((int(c), r) for c, r in data.get("conv_flops", {}).items())),
                 conv3d_flops=tuple(sorted((int(c), r) for c, r in data.get("conv3d_flops", {}).items())),
                 norm_s_per_element=data.get("norm_s_per_element", 0.0),
                 norm3d_s_per_element=data.get("norm3d_s_per_element", 0.0), calibrated=calibrated,
                 **_engine_overheads(data, ranks))


def _nearest(table: dict, ranks: int) -> str:
    """The calibrated world size nearest `ranks` (the larger on a tie)."""
    return min(table, key=lambda n: (abs(int(n) - ranks), -int(n)))


def _engine_overheads(data: dict, ranks: int) -> dict:
    table = data.get("engine_overheads") or {}
    if not table:
        return {}
    call, generate = table[_nearest(table, ranks)]
    return {"call_overhead_s": call, "generate_overhead_s": generate}


def _collectives(data: dict, ranks: int) -> Collectives | None:
    """The measured collectives of the calibrated world size nearest `ranks` (the larger on a tie)."""
    table = data.get("collectives") or {}
    if ranks < 2 or not table:
        return None
    size = _nearest(table, ranks)
    fields = set(Collectives.__dataclass_fields__)
    return Collectives(**{kind: Link(*figures) for kind, figures in table[size].items() if kind in fields})


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
        if value is not None and (not isinstance(value, int) or isinstance(value, bool) or not
                                  1 <= value <= MAX_RANKS):
            raise ConfigError(f"{flag} must be a whole number >= 1 (at most {MAX_RANKS}), got {value!r}.")
    if (gpus or 1) * nodes > MAX_RANKS:
        raise ConfigError(f"--gpus {gpus} x --nodes {nodes} is {(gpus or 1) * nodes} ranks; meshdit plans for at most "
                          f"{MAX_RANKS}: use fewer --gpus or --nodes.")
    if preset == CPU_HERE:
        world = replace(cpu_here((gpus or 1) * nodes), gpus_per_node=gpus or 1, nodes=nodes)
    else:
        world = PRESETS[preset].with_size(gpus or 1, nodes)
    if memory is not None:
        nbytes = parse_bytes(memory, "--gpu-memory")
        if not MEMORY_RANGE[0] <= nbytes <= MEMORY_RANGE[1]:  # also inf, from a number too long for a float
            raise ConfigError(f"--gpu-memory {memory} is out of range: give 1MB..1PB per GPU, e.g. --gpu-memory 80GB.")
        world = replace(world, memory_bytes=nbytes)
    for flag, value, attr in (("--intra-node-gbps", intra_gbps, "intra"), ("--inter-node-gbps", inter_gbps, "inter")):
        if value is not None:
            if not (isinstance(value, (int, float)) and 0 < value <= MAX_LINK_GBPS):  # also nan and inf
                raise ConfigError(f"{flag} must be a number of GB/s in (0, {MAX_LINK_GBPS:g}], got {value}: e.g. "
                                  f"{flag} 50.")
            world = replace(world, **{attr: Link(getattr(world, attr).latency_s, value * 1e9)})
    return world


UNCALIBRATED_NOTE = ("this machine is not calibrated, so its CPU times are default figures and can be several times "
                     "off: run `meshdit plan --calibrate` once (about 2 minutes)")


def describe(world: World) -> str:
    figures = asdict(world)
    return (f"{world.name}: {world.nodes} node(s) x {world.gpus_per_node} rank(s), "
            f"{world.memory_bytes / 1e9:.1f} GB per rank, {world.flops / 1e12:.3g} TFLOP/s sustained per rank, "
            f"links {figures['intra']['bandwidth'] / 1e9:.3g} GB/s inside a node, "
            f"{figures['inter']['bandwidth'] / 1e9:.3g} GB/s between nodes")
