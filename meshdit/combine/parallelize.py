"""The one place that combines strategies, in a fixed order."""
from __future__ import annotations

from ..attention.router import apply_attention_backend
from ..distributed.mesh import ParallelMesh, SingleProcessMesh
from ..mesh_axes import MeshAxis
from ..parallel.offload import apply_block_offload
from ..parallel.pipefusion import PipeFusion
from ..parallel.plan import ModelPlan
from ..parallel.sequence import apply_sequence_parallel
from ..parallel.tensor import apply_tensor_parallel, tensor_plan_for
from . import fp8_runtime
from .parallelized import Parallelized


def denoisers(pipe) -> list:
    """The pipeline's transformers the plan applies to: `transformer`, and Wan 2.2's second expert
    `transformer_2` where the pipeline has one (either slot may be empty)."""
    return [m for m in (getattr(pipe, "transformer", None), getattr(pipe, "transformer_2", None)) if m is not None]


def parallelize(pipe, plan: ModelPlan, mesh: ParallelMesh | SingleProcessMesh, fp8=None,
                offload: str | None = None) -> Parallelized:
    """Applies every strategy the mesh asks for, and the FP8 options of `fp8` (an Fp8Config), to `pipe`.

    Combinations that cannot run exactly were refused by validation before any
    rank started, so this only applies. CFG and data parallelism (parallel/cfg.py,
    parallel/data.py) need no hooks: the returned object splits their work when the
    engine drives it. With fp8 None or all off, nothing FP8 is installed: the
    computation is the exact one. offload "blocks": the blocks' weights wait in host memory between uses
    (parallel/offload.py; after tp and FP8, so the shards and FP8 weights are what moves).
    """
    done = Parallelized(mesh)
    done.stage_plan = plan.stages  # step cache (meshdit/cache): hooks these block lists per request
    done.denoisers = denoisers(pipe)
    done.offload = offload
    config = mesh.config
    if fp8 is not None:  # the CLI checked it before ranks started; an API caller learns here
        fp8.validate(config.pipefusion_parallel_degree)
    if config.compile:
        from ..parallel.compile import check_backend

        check_backend(config.compile)  # before any hook is installed
    device = mesh.device
    backend = fp8_runtime.attention_backend(fp8, device)
    transformers = done.denoisers
    if backend is not None:  # attention no sequence-parallel hook routes (serial, cross-attention)
        for transformer in transformers:
            done.handles += apply_attention_backend(transformer, backend)
    if config.sp_degree > 1 or config.pipefusion_parallel_degree > 1:
        # PipeFusion reuses the sequence hooks to cut the image stream into patches
        codecs = fp8_runtime.wire_codecs(fp8, device)
        done.sequence_state, handles = apply_sequence_parallel(transformers, plan.sequence, mesh, backend, codecs)
        done.handles += handles
    if config.pipefusion_parallel_degree > 1:
        done.pipefusion = PipeFusion(transformers, plan.stages, mesh, done.sequence_state,
                                     fp8_runtime.pipe_codec_for(fp8, device),
                                     fp8_runtime.stale_kv_format(fp8, device))
        done.handles += done.pipefusion.handles
    for transformer in transformers:
        tensor = None
        if config.tensor_parallel_degree > 1:
            # after PipeFusion's cut (every tp rank of a stage cuts the same whole blocks), before FP8 (the
            # shards are quantized, not the whole weights); attention then runs over the local heads
            tensor = apply_tensor_parallel(transformer, tensor_plan_for(transformer, plan.tensor), plan.stages,
                                           mesh.group(MeshAxis.TP))
        if fp8 is not None and fp8.gemm:
            # after PipeFusion's split: stages balance as without FP8, and only this stage's blocks are quantized
            fp8_runtime.quantize_transformer(transformer, [spec.path for spec in plan.stages.blocks])
        done.tensor_parallel.append(tensor)
        if tensor is not None:  # on the Linears as they are now (FP8 ones included)
            tensor.install_reduces(transformer)
            done.handles += tensor.handles
        if offload == "blocks":  # the weights as they now are: this stage's blocks, tp shards, FP8
            done.handles.append(apply_block_offload(transformer, plan.stages, device))
        if config.compile:  # last: the blocks this stage keeps, FP8 Linear layers included
            from ..parallel.compile import compile_blocks

            done.handles += compile_blocks(transformer, plan.stages, config.compile)
    return done
