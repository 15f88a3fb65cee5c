"""Jobs of tests/attention/test_router.py, run on every rank of the pool (module-level: they are pickled).

The model is tiny PixArt-Σ: its image self-attention `transformer_blocks.*.attn1` is plan-marked ("img"), its
cross-attention LOCAL. diffusers' classic `AttnProcessor` computes attention with baddbmm, softmax and bmm,
never calling torch's SDPA: the processor the seam guard must catch."""
import dataclasses

import torch
from diffusers.models.attention_processor import AttnProcessor

from meshdit.combine.parallelize import parallelize
from meshdit.denoising.recipe import COND
from meshdit.distributed.comm import all_gather_uneven
from meshdit.engine import Engine
from meshdit.errors import ConfigError
from meshdit.models.pixart import PLAN
from meshdit.attention.router import note_exchanged
from meshdit.parallel.plan import NotSdpa
from meshdit.testing.rank_pool import mesh_for, split_layout
from meshdit.testing.tiny_models import tiny_pipeline
from tests.parallel.sp_jobs import request

NAME = "pixart-sigma"


def _pipeline(matmul_attention: tuple[str, ...] = ()):
    """A fresh tiny pipeline whose attention modules `matmul_attention` run diffusers' AttnProcessor."""
    pipe = tiny_pipeline(NAME)
    pipe.set_progress_bar_config(disable=True)
    modules = dict(pipe.transformer.named_modules())
    for path in matmul_attention:
        modules[path].set_processor(AttnProcessor())
    return pipe


def generate(degrees: dict, matmul_attention: tuple[str, ...] = ()):
    """The image of Engine.generate on this layout: [N, H, W, 3]."""
    pipe = _pipeline(matmul_attention)
    config, settings = split_layout(degrees)
    engine = Engine(pipe, mesh_for(config) if config.world_size > 1 else None)
    try:
        return engine.generate(request(NAME, 32, 32, **settings)).images
    finally:
        engine.close()


def gather_kv(module, state, path, streams):
    """A NotSdpa exchange for a self-attention module running AttnProcessor (attention by matmul): the outputs
    of its K and V projections [B, S/sp, C] are all-gathered over the SP ranks, so this rank's queries attend
    over every token, as in one process. (Linear attention would all-reduce its K.V summary here instead.)"""
    if state.stale_kv is not None:
        raise ConfigError(f"{path}: this exchange keeps no stale K/V for PipeFusion")

    def gathered(_mod, _args, out):  # [B, S/sp, C] -> [B, S, C]
        note_exchanged()
        return all_gather_uneven(out, 1, state.lens("img"), state.sp_group)

    return [module.to_k.register_forward_hook(gathered), module.to_v.register_forward_hook(gathered)]


def transformer_output(degrees: dict, matmul_attention: tuple[str, ...], not_sdpa: tuple[str, ...]):
    """(the transformer's output at the first step under `degrees` with the plan marking the attention modules
    `not_sdpa` NotSdpa(gather_kv), the same transformer's output in this process without hooks): [B, C, H, W]."""
    pipe = _pipeline(matmul_attention)
    config, settings = split_layout(degrees)
    serial = Engine(pipe, None)  # installs nothing: gives the recipe's inputs
    req = request(NAME, 32, 32, **settings)
    with torch.inference_mode():
        state = serial.recipe.prepare(req, torch.Generator().manual_seed(req.seed), torch.device("cpu"))
        inputs = serial.recipe.model_inputs(state, state.latents, state.timesteps[0], COND)
        expected = pipe.transformer(**inputs, return_dict=False)[0]
    serial.close()
    attention = {path: NotSdpa(("img",), gather_kv) for path in not_sdpa} | PLAN.sequence.attention
    plan = dataclasses.replace(PLAN, sequence=dataclasses.replace(PLAN.sequence, attention=attention))
    done = parallelize(pipe, plan, mesh_for(config))
    try:
        with torch.inference_mode():
            return pipe.transformer(**inputs, return_dict=False)[0], expected
    finally:
        done.remove()
