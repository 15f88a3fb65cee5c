"""`meshdit plan`: the table of every legal layout with its predicted memory and time, and the recommendation
(no torch: it reads config JSON only); `meshdit plan --calibrate` measures this machine for the cpu-here preset."""
from __future__ import annotations

import json
import re

from ..config import GenerateRequest
from ..errors import ConfigError
from ..flags import parse_extra
from .choose import load_model, make_plan, smallest_fitting_world
from .hardware import CPU_HERE, PRESET_NAMES, UNCALIBRATED_NOTE, describe, world_from
from .snapshots import snapshot_names


def add_plan_parser(commands) -> None:
    p = commands.add_parser(
        "plan", help="list every layout of a world with predicted memory and time, and pick one",
        description="Predict per-rank peak memory and time of every legal layout (dp x cfg x pp x ring x ulysses, "
                    "VAE decode, FP8) of a model on a world, and recommend one (cost model: docs/planner.md). "
                    "Reads config JSON only: no weights, no torch.")
    p.add_argument("--model", default=None, metavar="DIR_OR_HUB_ID_OR_SNAPSHOT",
                   help=f"a pipeline folder, Hub id, or built-in snapshot: {', '.join(snapshot_names())} "
                        "(default: the bundled model)")
    req = p.add_argument_group("request")
    req.add_argument("--size", metavar="HxW", help="image size in pixels, e.g. 1024x1024 (default: the model's)")
    req.add_argument("--height", type=int, help="pixels (default: the model's)")
    req.add_argument("--width", type=int, help="pixels (default: the model's)")
    req.add_argument("--num-frames", "--frames", dest="num_frames", type=int, help="video models: frames")
    req.add_argument("--steps", type=int, help="denoising steps (default: the model's)")
    req.add_argument("--guidance-scale", "--guidance", dest="guidance_scale", type=float,
                     help="guidance scale; > 1 runs two branches (CFG) on models that are not guidance-distilled")
    req.add_argument("--images", type=int, default=1, help="images in one request (default: 1)")
    req.add_argument("--extra", action="append", default=None, metavar="KEY=JSON",
                     help="a recipe argument as in meshdit generate, e.g. SD3's --extra skip_guidance_layers=[7,8,9] "
                          "(a third guidance branch: --cfg-degree 3 becomes legal) (default: none)")
    req.add_argument("--warmup-steps", type=int, default=1, help="PipeFusion's warmup steps (default: 1)")
    req.add_argument("--num-pipeline-patch", type=int, default=None, help="PipeFusion's patches (default: degree)")
    hw = p.add_argument_group("world")
    hw.add_argument("--preset", default=None, choices=PRESET_NAMES,
                    help="hardware figures (default: h100-sxm when --gpus is given, else cpu-here)")
    hw.add_argument("--gpus", type=int, default=None, help="GPUs (ranks) per node (default: 1)")
    hw.add_argument("--nodes", type=int, default=1, help="nodes (default: 1)")
    hw.add_argument("--gpu-memory", default=None, metavar="SIZE", help="memory per GPU, e.g. 32GB (default: the preset's)")
    hw.add_argument("--intra-node-gbps", type=float, default=None, help="GB/s per rank inside a node")
    hw.add_argument("--inter-node-gbps", type=float, default=None, help="GB/s per rank between nodes")
    out = p.add_argument_group("output")
    out.add_argument("--no-fp8", action="store_true", help="leave the FP8 variants out")
    out.add_argument("--fits-only", action="store_true", help="list only layouts that fit")
    out.add_argument("--top", type=int, default=None, help="list at most N rows")
    out.add_argument("--json", action="store_true", help="print the plan as JSON")
    p.add_argument("--calibrate", action="store_true",
                   help="measure this machine's matmul throughput and gloo latency/bandwidth (2 ranks) for the "
                        "cpu-here preset, save them, and exit")


def parse_size(text: str) -> tuple[int, int]:
    match = re.fullmatch(r"\s*(\d+)\s*[xX*]\s*(\d+)\s*", text or "")
    if not match:
        raise ConfigError(f"--size {text!r} is not HxW: write it like --size 1024x1024 (height x width).")
    return int(match.group(1)), int(match.group(2))


MAX_IMAGES = 4096
"""Images of one request `meshdit plan` takes (the request holds a prompt per image)."""


def request_from_plan_args(args) -> GenerateRequest:
    height, width = parse_size(args.size) if args.size else (args.height, args.width)
    if not 1 <= args.images <= MAX_IMAGES:
        raise ConfigError(f"--images must be in 1..{MAX_IMAGES}, got {args.images}.")
    if args.top is not None and args.top < 1:
        raise ConfigError(f"--top must be >= 1, got {args.top} (drop it to list every row).")
    request = GenerateRequest(prompt=["a prompt"] * args.images, height=height, width=width,
                              num_inference_steps=args.steps, guidance_scale=args.guidance_scale,
                              num_frames=args.num_frames, warmup_steps=args.warmup_steps,
                              num_pipeline_patch=args.num_pipeline_patch, extra=parse_extra(args.extra))
    return request


def plan_command(args) -> int:
    if args.calibrate:
        from .calibrate import calibrate

        calibrate()
        return 0
    preset = args.preset or ("h100-sxm" if args.gpus else CPU_HERE)
    world = world_from(preset, args.gpus, args.nodes, args.gpu_memory, args.intra_node_gbps, args.inter_node_gbps)
    _, info, costs = load_model(args.model)
    request = request_from_plan_args(args)
    request.validate()
    plan = make_plan(info, costs, request, world, fp8_options=not args.no_fp8 and preset != CPU_HERE)
    if args.json:
        print(json.dumps(plan_json(plan), indent=1))
        return 0
    print(format_plan(plan, args))
    if plan.recommended is None:
        smallest = smallest_fitting_world(info, costs, plan.request, world)
        print(f"\nNothing fits {world.size} rank(s) of {world.memory_bytes / 1e9:.1f} GB; "
              + (f"the smallest world with a fitting layout has {smallest} ranks." if smallest
                 else "no world up to 256 ranks fits."))
        return 1
    return 0


def _count(n: float) -> str:
    return f"{n / 1e9:.2f} B" if n >= 1e9 else f"{n / 1e6:.2f} M"


def _gb(x: float) -> str:
    return f"{x / 1e9:.2f}" if x < 1e10 else f"{x / 1e9:.1f}"


def format_plan(plan, args) -> str:
    r = plan.request
    info = plan.costs.info
    frames = f" x {r.num_frames} frames" if info.is_video else ""
    branches = info.guidance_branches(r.guidance_scale, r.extra)
    cfg = {1: "one branch", 2: "two branches (CFG)"}.get(branches, f"{branches} branches (CFG + layer guidance)")
    cfg += f", --cfg-degree <= {branches}" if branches > 1 else ", no CFG parallelism"
    lines = [f"model: {info.source} ({info.pipeline_class}, transformer {_count(plan.costs.transformer_params)} "
             f"parameters, text encoders {_count(plan.costs.text_encoder_params)})",
             f"request: {r.height}x{r.width}{frames}, {r.num_inference_steps} steps, guidance {r.guidance_scale} "
             f"({cfg}), {len(r.prompts)} image(s), "
             f"{plan.costs.tokens(r.height, r.width, r.num_frames)} image tokens",
             f"world: {describe(plan.world)}", ""]
    lines += _table_header()
    rows = [p for p in plan.rows if p.fits or not args.fits_only]
    for p in rows[: args.top or None]:
        m = p.memory
        notes = []
        if not p.fits:
            notes.append("DOES NOT FIT")
        if not p.exact:
            notes.append("approximate")
        if p is plan.recommended:
            notes.insert(0, "<- recommended")
        lines.append(f"{p.layout.describe():<28} {p.layout.vae:<8} {'on' if p.layout.fp8 else '-':<3} "
                     f"{_text_place(p.layout):<8} {_gb(m.weights):>7} {_gb(m.text):>6} "
                     f"{_gb(m.activations):>6} {_gb(m.stale_kv):>6} {_gb(m.vae):>6} {_gb(m.peak):>6} "
                     f"{p.step_s:>8.3g} {p.total_s:>8.3g}  {' '.join(notes)}")
    hidden = len(rows) - min(len(rows), args.top or len(rows))
    if hidden:
        lines.append(f"... {hidden} more row(s) (drop --top)")
    fits = len(plan.fitting)
    lines += ["", *LEGEND]
    if not plan.world.calibrated:
        lines.append(f"note: {UNCALIBRATED_NOTE}.")
    lines.append(f"\n{len(plan.rows)} legal layout(s), {fits} fit.")
    if plan.recommended is not None:
        best = plan.recommended
        flags = best.layout.flags()
        lines.append(f"recommended: {best.layout.describe()} (predicted {best.total_s:.3g} s end to end, "
                     f"{best.memory.peak / 1e9:.2f} GB peak per rank): meshdit generate {flags}".rstrip())
    return "\n".join(lines)


LEGEND = (
    "decode: the VAE decode (plain: one rank; parallel: row bands over the image's ranks, exact; tiled: 1024 px",
    "  tiles, approximate). fp8: FP8 GEMMs. encoders: where the text encoders sit (dev: each rank's device;",
    "  split: their layers over the ranks; cpu: host memory).",
    "GB per rank: weights (the rank's transformer blocks, the rest of the transformer, the VAE), text (the text",
    "  encoders), activ (denoising's activations), kv (PipeFusion's stale K/V), vae (the decode's working set),",
    "  peak = weights + text + the larger of activ + kv and vae; a layout fits when peak <= 90% of a rank's memory.",
    "seconds: step (one denoising step; PipeFusion: a patch step), total (text encoding, every step, the decode).",
    "approximate: not serial's image (FP8, a tiled decode, or PipeFusion's stale patches).")
"""What each column of the table means (docs/planner.md has the formulas)."""


def _table_header() -> list[str]:
    """Two lines: the memory and time groups over their columns, then each column's name (each named once)."""
    left = f"{'':<28} {'':<8} {'':<3} {'':<8} "
    memory, seconds = f"{'GB per rank':-^44}", f"{'seconds':-^17}"
    names = (f"{'layout':<28} {'decode':<8} {'fp8':<3} {'encoders':<8} {'weights':>7} {'text':>6} {'activ':>6} "
             f"{'kv':>6} {'vae':>6} {'peak':>6} {'step':>8} {'total':>8}  notes")
    return [f"{left}{memory} {seconds}", names]


def plan_json(plan) -> dict:
    def row(p):
        m = p.memory
        return {"layout": dict(p.layout.degrees), "vae": p.layout.vae, "fp8": p.layout.fp8,
                "text_on_cpu": p.layout.text_on_cpu, "text_parallel": p.layout.text_parallel,
                "offload": p.layout.offload, "flags": p.layout.flags(),
                "memory_bytes": {"weights": m.weights, "text": m.text, "activations": m.activations,
                                 "stale_kv": m.stale_kv, "vae": m.vae, "peak": m.peak},
                "step_s": p.step_s, "total_s": p.total_s, "fits": p.fits, "exact": p.exact}

    return {"world": describe(plan.world), "rows": [row(p) for p in plan.rows],
            "recommended": row(plan.recommended) if plan.recommended else None}


def _text_place(layout) -> str:
    """Where the text encoders are: on the device (dev), split over the ranks (split), on the host (cpu)."""
    return "cpu" if layout.text_on_cpu else "split" if layout.text_parallel else "dev"
