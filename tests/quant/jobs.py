"""Jobs the FP8 tests run on every rank of the pool (module-level: they are pickled)."""
from __future__ import annotations

import torch

from meshdit.distributed.comm import comm_stats
from meshdit.engine import Engine
from meshdit.quant.settings import Fp8Config
from meshdit.testing.rank_pool import mesh_for, split_layout
from meshdit.testing.tiny_models import tiny_pipeline
from meshdit.vae import VaeDecodeSettings
from tests.parallel import sp_jobs

SIZE = (36, 44)  # 9 x 11 image tokens: shards and patches of uneven size
STEPS = 3


def run(name: str, degrees: dict, fp8: Fp8Config | None, steps: int = STEPS, size=SIZE, dtype=None,
        break_scale: bool = False, parallel_vae: bool = False) -> dict:
    """One generation on a freshly built tiny pipeline (FP8 weights and PipeFusion change it for good).

    Returns the guided noise predictions of every step stacked (None on ranks that do not guide,
    e.g. PipeFusion's first stages), this rank's bytes sent and their bfloat16 cost per step,
    transformer forwards, the bytes of the transformer blocks' weights this rank holds, and the most
    bytes PipeFusion's stale K/V buffers held at once (0 without PipeFusion).
    """
    pipe = tiny_pipeline(name)
    pipe.set_progress_bar_config(disable=True)
    if dtype is not None:
        pipe.to(dtype)
    config, settings = split_layout(degrees)
    vae = VaeDecodeSettings(parallel=parallel_vae)
    engine = Engine(pipe, mesh_for(config) if config.world_size > 1 else None, vae, fp8=fp8)
    if break_scale:  # a bug the error bound must catch: every FP8 weight scale off by 2x
        for module in pipe.transformer.modules():
            if hasattr(module, "weight_scale"):
                module.weight_scale.mul_(2)
    preds, forwards = [], [0]
    guide = engine.recipe.guide

    def recording_guide(state, branch_preds):
        out = guide(state, branch_preds)
        preds.append(out.clone())
        return out

    engine.recipe.guide = recording_guide
    stale_kv_bytes = [0]
    if engine._parallel.pipefusion is not None:
        stale_kv = engine._parallel.pipefusion.stale_kv
        attention = stale_kv.attention

        def measuring(*args):  # after every stale-K/V attention call: what the buffers hold
            out = attention(*args)
            stale_kv_bytes[0] = max(stale_kv_bytes[0], stale_kv.held_bytes())
            return out

        stale_kv.attention = measuring
    handle = pipe.transformer.register_forward_hook(lambda *_: forwards.__setitem__(0, forwards[0] + 1))
    try:
        comm_stats.reset()
        image = engine.generate(sp_jobs.request(name, *size, steps=steps, **settings)).images
        sent, bf16 = dict(comm_stats.bytes_sent), dict(comm_stats.bf16_bytes)
    finally:
        handle.remove()
        engine.close()
    return dict(preds=torch.stack(preds) if preds else None, image=image, sent=sent, bf16=bf16, forwards=forwards[0],
                steps=steps, block_bytes=block_bytes(pipe.transformer), stale_kv_bytes=stale_kv_bytes[0])


def block_bytes(transformer) -> int:
    """Weights (parameters and FP8 buffers) of the transformer's block lists held by this rank."""
    total = 0
    for name, tensor in list(transformer.named_parameters()) + list(transformer.named_buffers()):
        if "transformer_blocks." in name:
            total += tensor.numel() * tensor.element_size()
    return total
