"""A whole pipeline loaded leanly on one rank of a mesh."""
from __future__ import annotations

import os

import torch
import torch.distributed as dist

from ..errors import ConfigError
from ..mesh_axes import MeshAxis
from .load import LoadReport, load_model
from .options import LoadOptions
from .processors import processor_substitutes
from .text import ENCODING_RANK, encode_on_one_rank, text_encoder_names
from .text_stages import split_text_encoders


def local_folder(model: str) -> str:
    if os.path.isdir(model):
        return model
    from diffusers import DiffusionPipeline

    return DiffusionPipeline.download(model)


def load_pipeline_efficiently(model: str, device: torch.device, dtype: torch.dtype, mesh,
                              options: LoadOptions, vae_here: bool = True,
                              fp8_gemm: bool = False):
    """The pipeline with its transformer loaded from one shared or streamed copy of the weights.

    Under PipeFusion the transformer's other-stage blocks stay on the meta device (never
    materialised); PipeFusion replaces them with pass-through blocks. Text encoders load on
    the encoding rank only; the VAE only where vae_here (elsewhere: a skeleton on meta).
    fp8_gemm: the block lists' Linear layers become FP8 as their weights arrive (under tensor parallelism they
    arrive cut to this rank's shards instead, and parallelize quantizes the shards).
    """
    from diffusers import DiffusionPipeline

    from ..models.registry import family_for_transformer
    from .skeleton import build_skeleton, component_class
    from .stages import stage_keep

    folder = local_folder(model)
    family = family_for_transformer(component_class(folder, "transformer").__name__)
    select = on_loaded = None
    if mesh.size(MeshAxis.PP) > 1:
        select = lambda skeleton: stage_keep(skeleton, family.plan().stages, mesh.local_rank(MeshAxis.PP),  # noqa: E731
                                             mesh.size(MeshAxis.PP))
    if mesh.size(MeshAxis.TP) > 1:  # each Linear of the blocks cut to this rank's shard as it lands
        from ..parallel.tensor import ShardWhileLoading

        on_loaded = ShardWhileLoading(family.plan().tensor, family.plan().stages, mesh.size(MeshAxis.TP),
                                      mesh.local_rank(MeshAxis.TP))
    elif fp8_gemm:
        from ..quant.fp8_linear import QuantizeWhileLoading
        from ..quant.formats import check_fp8_gemm

        check_fp8_gemm(device)
        on_loaded = QuantizeWhileLoading([spec.path for spec in family.plan().stages.blocks])
    transformer, report = load_model(folder, "transformer", device, dtype, select,
                                     options.transport_for(device.type), on_loaded=on_loaded)
    encoders = text_encoder_names(folder)
    # Only the encoding rank loads the text encoders and the others get its embeddings, unless the encoders' layers
    # are split over the ranks (each loads them, then keeps its stage before anything reaches the device).
    encoding_here = options.text_encoder_parallel or dist.get_rank() == ENCODING_RANK
    skipped = {} if encoding_here else {name: None for name in encoders}
    if not vae_here and os.path.isdir(os.path.join(folder, "vae")):
        skipped["vae"] = build_skeleton(folder, "vae")  # the config without the weights
    try:
        pipe = DiffusionPipeline.from_pretrained(folder, transformer=transformer, dtype=dtype,
                                                 **processor_substitutes(folder), **skipped)
    except (OSError, ValueError) as exc:
        raise ConfigError(f"could not load the pipeline {model!r}: {exc}") from exc
    pipe.set_progress_bar_config(disable=True)
    encoder_device = torch.device(options.text_encoder_device or device)
    if options.text_encoder_parallel:
        split_text_encoders(pipe, encoders)  # still in host memory: only this rank's stage moves on
    for name, component in pipe.components.items():
        if isinstance(component, torch.nn.Module) and name != "transformer" and name not in skipped:  # in place
            component.to(encoder_device if name in encoders else device)
    if not options.text_encoder_parallel:
        encode_on_one_rank(pipe, device, encoder_device)
    pipe.load_report = report
    return pipe


__all__ = ["load_pipeline_efficiently", "LoadReport"]
