"""The cost model: per-rank peak memory and time of one layout (docs/planner.md writes every formula out)."""
from __future__ import annotations

import math
from dataclasses import dataclass

from ..config import GenerateRequest
from ..mesh_axes import MeshAxis
from .hardware import Link, World
from .layouts import Layout
from .model_costs import ModelCosts

ACTIVATION_TENSORS_FIXED = 3
"""Hidden-sized tensors alive at a block's peak besides its MLP's: 3 + 3 x mlp_ratio in all (docs/planner.md)."""
VAE_DECODE_TENSORS = 7.5
"""Full-resolution, base-channel tensors alive at the VAE decoder's peak (docs/figures.md, "VAE decode memory")."""
CALLS_PER_BLOCK = 100
"""Operator calls of one transformer block's forward (projections, norms, modulation, attention, MLP)."""
RING_STEP_CALLS = 8
"""Kernel calls one ring step adds per attention (the block's attention, the merge's exp, scale and add)."""
VIDEO_CHANNELS = 3
"""Channels of a decoded video frame (RGB), held for every frame decoded so far."""
USABLE_MEMORY = 0.9
"""Share of a rank's memory a layout may plan to use (allocator slack, the runtime's own context)."""
ULYSSES_BUFFERS = 6
"""Extra hidden-sized (per rank) tensors Ulysses holds at its peak: q, k, v packed for the all-to-all and received
(measured on the benchmark model, docs/planner.md "Memory predictions checked")."""
TP_REDUCES_PER_BLOCK = 2
"""All-reduces tensor parallelism adds per block (after the attention's and the MLP's row-parallel Linears)."""
FP8_KV_BYTES = 1.1
"""Bytes per stale K/V element held in FP8 (e4m3 values and a float32 scale per token and head)."""


@dataclass(frozen=True)
class Memory:
    weights: float
    text: float
    activations: float
    stale_kv: float
    vae: float

    @property
    def peak(self) -> float:
        """Rank 0's peak: its weights and text encoders, and the larger of denoising's and the decode's working
        set (the stale K/V are freed before the VAE decodes)."""
        return self.weights + self.text + max(self.activations + self.stale_kv, self.vae)


@dataclass(frozen=True)
class Prediction:
    layout: Layout
    memory: Memory
    step_s: float
    """One denoising step after the warmup (PipeFusion: a patch step)."""
    total_s: float
    """Text encoding + every step + VAE decode."""
    fits: bool
    exact: bool
    """Gives serial's image: no PipeFusion staleness, no FP8, no tiled decode."""
    comm_s: float
    """Of step_s: the communication not hidden behind compute."""
    calibrated: bool = True
    """The world's figures were measured or are a GPU preset's (hardware.World.calibrated)."""
    node_bytes: float = 0.0
    """What must fit: a rank's peak, or where the ranks share host memory (CPU ranks) what the node's ranks hold
    together (one mapped copy of the weights, each rank's working set)."""


def axis_link(layout: Layout, axis: str, world: World) -> Link:
    """The link an axis' group talks over: inside a node when the group's ranks are neighbours within one
    (innermost axes vary fastest, distributed/mesh.py)."""
    axes = [a for a, _ in layout.degrees]
    inner = math.prod(layout.degree(a) for a in axes[axes.index(axis) + 1:])
    span = inner * layout.degree(axis)
    return world.intra if span <= world.gpus_per_node else world.inter


def _stage_blocks(costs: ModelCosts, stages: int) -> list[list]:
    """Contiguous stages balanced by image-token parameters (pipefusion.block_weight's rule)."""
    blocks = list(costs.blocks)
    total = sum(b.image_params for b in blocks)
    out, current, acc = [], [], 0.0
    for i, b in enumerate(blocks):
        current.append(b)
        acc += b.image_params
        left_blocks, left_stages = len(blocks) - i - 1, stages - len(out) - 1
        if left_stages and (acc >= total * (len(out) + 1) / stages or left_blocks == left_stages):
            out.append(current)
            current = []
    out.append(current)
    return out


def _collective_s(world: World, layout: Layout, axis: str, kind: str, calls: float, nbytes: float) -> float:
    """Seconds of `calls` collectives of one kind (a field of hardware.Collectives) on an axis' group moving
    `nbytes` per rank in all."""
    return _group_collective_s(world, axis_link(layout, axis, world), layout.degree(axis), kind, calls, nbytes)


def _group_collective_s(world: World, link: Link, group: int, kind: str, calls: float, nbytes: float) -> float:
    """The measured per-call figures where the world has them (cpu-here), else the link per message of the
    algorithm (an all-to-all: group - 1 pairwise steps; Ulysses attention two of them; a ring all-reduce:
    2(group - 1))."""
    if world.collectives is not None:
        return getattr(world.collectives, kind).seconds(calls, nbytes)
    steps = {"exchange": 1, "ring_step": 1, "pipefusion_hop": 1, "all_to_all": group - 1,
             "ulysses_attention": 2 * (group - 1), "all_reduce": 2 * (group - 1)}[kind]
    return link.seconds(calls * steps, nbytes)


def _vae_seconds(layout: Layout, costs: ModelCosts, world: World, request: GenerateRequest, images: int,
                 dp: int) -> float:
    """The decode: every level's convolutions at the measured rate for its channels, its norms at the measured time
    per element, and the mid block's attention;
    in parallel the convolutions split over the image group (its ranks, and every data-parallel group, decode at
    once), the attention runs whole on every rank (on the gathered latent), and each conv exchanges halo rows and
    each norm all-reduces its statistics (patch_parallel.py); where measured (cpu-here), the parallel decode's
    fixed cost per image instead."""
    frames = request.num_frames if costs.info.is_video else 1
    split = layout.image_group if layout.vae == "parallel" else 1
    share = world.share(split * dp)
    convs = sum(f / world.conv_rate(c, costs.vae_conv3d)
                for c, f in costs.vae_level_flops(request.height, request.width, frames))
    convs += costs.vae_norm_elements(request.height, request.width, frames) * (
        world.norm3d_s_per_element if costs.vae_conv3d else world.norm_s_per_element)  # split like the convs
    attention = costs.vae_attention_flops(request.height, request.width, frames) / (world.attention_flops or
                                                                                   world.flops)
    seconds = images * (convs / split + attention) / share
    if split > 1:
        conv_count, norm_count = costs.vae_convs_and_norms
        chunks = images * ((frames - 1) // costs.info.vae_temporal_factor + 1 if costs.info.is_video else 1)
        if world.collectives is not None and world.collectives.parallel_decode is not None:
            seconds += images * world.collectives.parallel_decode.latency_s
        else:
            seconds += chunks * (_group_collective_s(world, world.intra, split, "exchange", conv_count, 0)
                                 + _group_collective_s(world, world.intra, split, "all_reduce", 2 * norm_count, 0))
    return seconds * (1.25 if layout.vae == "tiled" else 1.0)  # overlapping tiles


def predict(layout: Layout, costs: ModelCosts, world: World, request: GenerateRequest,
            stage: int | None = None) -> Prediction:
    """stage: the memory of that PipeFusion stage's ranks (default: the heaviest stage's, what must fit)."""
    info = costs.info
    dtype = world.dtype_bytes
    dp, cfg, pp = layout.degree(MeshAxis.DP), layout.degree(MeshAxis.CFG), layout.degree(MeshAxis.PP)
    ring, uly = layout.degree(MeshAxis.RING), layout.degree(MeshAxis.ULYSSES)
    tp = layout.degree(MeshAxis.TP)  # splits the blocks' heads and MLP hidden (their Linears) over its ranks
    sp = ring * uly
    images = len(request.prompts) * request.num_images_per_prompt
    # per rank: the busiest step's branches dealt round-robin over the cfg ranks (parallel/cfg.py)
    branches = math.ceil(info.guidance_branches(request.guidance_scale, request.extra) / cfg)
    batch = math.ceil(images / dp) * branches
    batched = info.family.costs.batched_branches  # one call for every branch (Recipe.batch_branches)
    live_batch = batch if batched else math.ceil(images / dp)
    calls = 1 if batched else branches  # transformer calls per step: each sends its own messages
    image_tokens = costs.tokens(request.height, request.width, request.num_frames)
    text_tokens = int(request.extra.get("max_sequence_length") or info.request_defaults().max_sequence_length)
    seq = image_tokens + text_tokens
    d = costs.hidden
    steps = request.num_inference_steps
    warmup = min(request.warmup_steps, steps) if pp > 1 else steps
    patches = request.patches(layout.parallel_config()) if pp > 1 else 1
    flops = world.fp8_flops if layout.fp8 else world.flops

    # --- memory of rank 0 (it holds the text encoders and decodes) ---
    stages = _stage_blocks(costs, pp)
    stage_params = max(sum(b.params for b in s) for s in stages) if stage is None else \
        sum(b.params for b in stages[stage])
    block_bytes = 1 if layout.fp8 else dtype
    block_weights = stage_params * block_bytes / tp
    if layout.offload:  # the running block and the prefetched next one
        block_weights = min(block_weights, 2 * max(b.params for b in costs.blocks) * block_bytes / tp)
    weights = block_weights + costs.other_params * dtype + costs.vae_params * dtype
    text = 0.0 if layout.text_on_cpu else costs.text_encoder_params * dtype
    if layout.text_parallel:  # each rank holds 1 / world of the layers, the token embeddings whole
        text -= costs.text_encoder_layer_params * (1 - 1 / layout.world_size) * dtype
    # the residual stream stays whole on every tp rank; the MLP hidden and the heads' q, k, v are split
    tensors = ACTIVATION_TENSORS_FIXED + (3 * costs.mlp_ratio + (ULYSSES_BUFFERS if uly > 1 else 0)) / tp
    activations = tensors * live_batch * seq / sp * d * dtype
    stale = 0.0
    if pp > 1 and warmup < steps:
        layers = max(len(s) for s in stages) if stage is None else len(stages[stage])
        stale = 2 * layers * batch * seq * (d / uly / tp) * (FP8_KV_BYTES if layout.fp8 else dtype)
    frames = info.vae_temporal_factor + 1 if info.is_video else 1  # causal video VAEs decode a few frames at a time
    decoded_images = math.ceil(images / dp)
    pixels = request.height * request.width
    if layout.vae == "parallel":
        pixels /= layout.image_group
    elif layout.vae == "tiled":
        pixels = min(pixels, layout.vae_tile[0] * layout.vae_tile[1])
    vae = VAE_DECODE_TENSORS * pixels * costs.vae_base_channels * frames * decoded_images * dtype
    if info.is_video:  # and the frames decoded so far, which the decoder keeps until the last chunk
        vae += pixels * VIDEO_CHANNELS * (request.num_frames or 1) * decoded_images * dtype
    memory = Memory(weights, text, activations, stale, vae)

    # --- time ---
    share = world.share(world.size)  # CPU ranks: more ranks than cores take turns on them
    linear_flops, attention_flops = costs.step_flops(image_tokens, text_tokens, batch)
    attention_s = attention_flops / sp / tp / ((world.attention_flops or flops) * share)
    compute_full = linear_flops / sp / tp / (flops * share) + attention_s + \
        calls * (len(costs.blocks) * CALLS_PER_BLOCK * world.launch_s + world.call_overhead_s) / share
    attn_layers = len(costs.blocks)
    comm = 0.0
    if uly > 1:  # q, k, v in one all-to-all, the output back in another, per attention layer
        per_rank = batch * seq / sp * d / tp * dtype * (uly - 1) / uly
        comm += attn_layers * _collective_s(world, layout, MeshAxis.ULYSSES, "ulysses_attention", calls,
                                            4 * per_rank)
    if ring > 1:  # K and V blocks passed ring - 1 times per attention, overlapped with the attention's compute
        kv = 2 * batch * (seq / sp) * (d / uly / tp) * dtype
        ring_s = attn_layers * _collective_s(world, layout, MeshAxis.RING, "ring_step", (ring - 1) * calls,
                                             (ring - 1) * kv)
        hidden = 0.0 if world.cores else attention_s  # CPU ranks: gloo's copies run on the cores that compute
        comm += max(0.0, ring_s - hidden)
        if world.collectives is None:  # each ring step is its own attention call plus a log-sum-exp merge (the
            # measured ring_step includes them)
            comm += calls * attn_layers * (ring - 1) * RING_STEP_CALLS * world.launch_s / share
    if tp > 1:  # two all-reduces of the block's output per block (attention out, MLP out), ring algorithm
        reduce_bytes = batch * seq / sp * d * dtype
        comm += TP_REDUCES_PER_BLOCK * len(costs.blocks) * _collective_s(
            world, layout, MeshAxis.TP, "all_reduce", calls, 2 * (tp - 1) / tp * reduce_bytes)
    if cfg > 1:  # the noise predictions' gather
        comm += _collective_s(world, layout, MeshAxis.CFG, "exchange", 1,
                              batch * image_tokens * costs.out_channels * 4)
    if layout.offload:  # every block of the stage crosses the host link once per transformer call, behind compute
        copy_s = calls * stage_params * block_bytes / tp / world.host_link_bps
        comm += max(0.0, copy_s - compute_full / pp)
    step_full = compute_full + comm
    if pp > 1:
        activations_bytes = batch * seq / sp * d * dtype
        # every patch's activations to the next stage, behind the next patch's compute on GPUs
        kind = "pipefusion_hop" if world.collectives is not None and world.collectives.pipefusion_hop else "exchange"
        hop = _collective_s(world, layout, MeshAxis.PP, kind, patches, activations_bytes)
        step_patch = compute_full / pp + max(0.0, hop - (0.0 if world.cores else compute_full / pp)) + comm / pp
        bubble = (pp - 1) * (compute_full / pp / patches) if warmup < steps else 0.0
        step_warm = compute_full + (pp - 1) * _collective_s(world, layout, MeshAxis.PP, "exchange", 1,
                                                            activations_bytes) + comm
        denoise = warmup * step_warm + (steps - warmup) * step_patch + bubble
        step, comm_s = step_patch, step_patch - compute_full / pp
    else:
        denoise = steps * step_full
        step, comm_s = step_full, comm
    text_s = 2 * costs.text_encoder_params * text_tokens * len(request.prompts) * (
        2 if info.runs_cfg(request.guidance_scale) else 1) / (world.flops * share)
    total = text_s + denoise + _vae_seconds(layout, costs, world, request, decoded_images, dp) + \
        world.generate_overhead_s / share
    exact = not layout.fp8 and layout.vae != "tiled" and (pp == 1 or warmup >= steps)
    if world.shares_host_memory:  # the node's ranks map one copy of the weights; each holds its own working set
        every_block = sum(b.params for b in costs.blocks) * block_bytes  # all stages' blocks, in one mapping
        need = (memory.weights - block_weights + every_block + memory.text
                + world.gpus_per_node * (memory.peak - memory.weights - memory.text))
        fits = need <= world.memory_bytes * world.gpus_per_node * USABLE_MEMORY
    else:
        need = memory.peak
        fits = need <= world.memory_bytes * USABLE_MEMORY
    return Prediction(layout, memory, step, total, fits, exact, comm_s, world.calibrated, need)


__all__ = ["Memory", "Prediction", "predict", "axis_link"]
