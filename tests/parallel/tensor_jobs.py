"""Jobs the tensor-parallel tests run on every rank of the pool (module-level: they are pickled).

Every job builds its own pipeline: tensor parallelism cuts the weights in place, so a shared one would not
serve the next layout."""
import torch

from meshdit.denoising.recipe import COND
from meshdit.distributed.comm import comm_stats
from meshdit.engine import Engine
from meshdit.loading import LoadOptions
from meshdit.loading.entry import load_pipeline
from meshdit.testing.rank_pool import mesh_for, split_layout
from meshdit.models.tiny.flux import tiny_flux_pipeline
from meshdit.testing.tiny_models import tiny_pipeline
from tests.parallel import sp_jobs


def fresh_pipeline(name: str):
    pipe = tiny_flux_pipeline(heads=6) if name == "flux-6heads" else tiny_pipeline(name)
    pipe.set_progress_bar_config(disable=True)
    return pipe


def block_bytes(transformer, stages) -> list[int]:
    """Parameter bytes of every block of the plan's block lists, in order."""
    sizes = []
    for spec in stages.blocks:
        for block in transformer.get_submodule(spec.path):
            sizes.append(sum(p.numel() * p.element_size() for p in block.parameters() if p.device.type != "meta"))
    return sizes


def run(name: str, degrees: dict, height: int, width: int, steps: int = 2, forward: bool = True,
        fp8_gemm: bool = False):
    """(transformer output at the first step or None, final image, tp all-reduce bytes of that forward, bytes per
    block of the plan's block lists). fp8_gemm: the blocks' Linears in FP8 (--fp8-gemm)."""
    from meshdit.quant.settings import Fp8Config

    pipe = fresh_pipeline(name)
    config, settings = split_layout(degrees)
    engine = Engine(pipe, mesh_for(config) if config.world_size > 1 else None,
                    fp8=Fp8Config(gemm=True) if fp8_gemm else None)
    try:
        req = engine.resolve(sp_jobs.request(name, height, width, steps=steps, **settings))
        out = tp_bytes = None
        if forward:  # one plain forward (not under PipeFusion, whose stages need its loop)
            with torch.inference_mode():
                state = engine.recipe.prepare(req, torch.Generator().manual_seed(3), torch.device("cpu"))
                inputs = engine.recipe.model_inputs(state, state.latents, state.timesteps[0], COND)
                comm_stats.reset()
                out = pipe.transformer(**inputs, return_dict=False)[0]
                if isinstance(out, list):  # Z-Image: one tensor per sample
                    out = torch.stack(out)
                tp_bytes = comm_stats.bytes_sent.get("tensor_parallel_all_reduce", 0)
        image = engine.generate(req).images
        blocks = block_bytes(pipe.transformer, engine.info.family.plan().stages)
        return out, image, tp_bytes, blocks
    finally:
        engine.close()


def lean_load(folder: str, degrees: dict, shapes_of: tuple[str, ...]):
    """(parameter bytes of the transformer after a lean load, per-block bytes, shapes of `shapes_of` params,
    image)."""
    from meshdit.models.flux import PLAN

    config, settings = split_layout(degrees)
    mesh = mesh_for(config) if config.world_size > 1 else None
    if mesh is None:
        from diffusers import DiffusionPipeline

        pipe = DiffusionPipeline.from_pretrained(folder, dtype=torch.float32)
        pipe.set_progress_bar_config(disable=True)
        loaded = sum(p.numel() * p.element_size() for p in pipe.transformer.parameters())
    else:
        pipe = load_pipeline(folder, mesh.device, torch.float32, mesh, LoadOptions())
        loaded = pipe.load_report.param_bytes
    params = dict(pipe.transformer.named_parameters())
    shapes = {n: tuple(params[n].shape) for n in shapes_of}
    blocks = block_bytes(pipe.transformer, PLAN.stages)
    engine = Engine(pipe, mesh)
    try:
        image = engine.generate(sp_jobs.request("flux", 36, 44, **settings)).images
    finally:
        engine.close()
    return loaded, blocks, shapes, image
