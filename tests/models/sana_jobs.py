"""Jobs of tests/models/test_sana.py, run on every rank of the pool (module-level: they are pickled)."""
import dataclasses

import torch

from meshdit.combine.parallelize import parallelize
from meshdit.denoising.recipe import COND
from meshdit.distributed.comm import comm_stats
from meshdit.engine import Engine
from meshdit.models.sana import PLAN
from meshdit.parallel.plan import NotSdpa
from meshdit.testing.rank_pool import mesh_for, split_layout
from meshdit.testing.tiny_models import tiny_pipeline
from tests.parallel.sp_jobs import request

NAME = "sana"
SIZE = (36, 44)  # 9 x 11 token rows and columns: divides by neither 2 nor 4


def do_nothing(module, state, path, streams):
    """A NotSdpa exchange that installs nothing: the linear attention would attend over this rank's tokens."""
    return []


def _plan(variant: str):
    sequence = PLAN.sequence
    if variant == "no-exchange":
        attention = {path: NotSdpa(value.streams, do_nothing) if isinstance(value, NotSdpa) else value
                     for path, value in sequence.attention.items()}
        sequence = dataclasses.replace(sequence, attention=attention)
    elif variant == "no-halo":
        sequence = dataclasses.replace(sequence, halos=())
    return dataclasses.replace(PLAN, sequence=sequence)


def transformer_output(degrees: dict, variant: str = "plan", processor: str | None = None):
    """(the transformer's output at the first step under `degrees` with the SANA plan (or a broken `variant` of
    it), the same output in this process without hooks, this rank's bytes per comm kind in that forward,
    torch SDPA calls made inside the self-attention modules in it). `processor`: a diffusers processor class
    given to every attn1 before the hooks."""
    import diffusers.models.attention_processor as processors

    pipe = tiny_pipeline(NAME)
    pipe.set_progress_bar_config(disable=True)
    config, settings = split_layout(degrees)
    serial = Engine(pipe, None)  # installs nothing: gives the recipe's inputs
    req = request(NAME, *SIZE, **settings)
    with torch.inference_mode():
        state = serial.recipe.prepare(req, torch.Generator().manual_seed(req.seed), torch.device("cpu"))
        inputs = serial.recipe.model_inputs(state, state.latents, state.timesteps[0], COND)
        expected = pipe.transformer(**inputs, return_dict=False)[0]
    serial.close()
    if processor is not None:
        from diffusers.models.transformers import sana_transformer

        cls = getattr(processors, processor, None) or getattr(sana_transformer, processor)
        for block in pipe.transformer.transformer_blocks:
            block.attn1.set_processor(cls())
    done = parallelize(pipe, _plan(variant), mesh_for(config))
    sdpa_calls = _count_sdpa_in_self_attention(pipe.transformer)
    try:
        comm_stats.reset()
        with torch.inference_mode():
            out = pipe.transformer(**inputs, return_dict=False)[0]
        return out, expected, dict(comm_stats.bytes_sent), sdpa_calls[0]
    finally:
        done.remove()


def _count_sdpa_in_self_attention(transformer) -> list:
    """[SDPA calls made while an attn1 runs], counted by wrapping torch's (routed) function during the forward."""
    import torch.nn.functional as F

    calls, inside = [0], [0]
    for block in transformer.transformer_blocks:
        block.attn1.register_forward_pre_hook(lambda *_: inside.__setitem__(0, inside[0] + 1))
        block.attn1.register_forward_hook(lambda *_: inside.__setitem__(0, inside[0] - 1))
    routed = F.scaled_dot_product_attention

    def counting(*args, **kwargs):
        calls[0] += inside[0] > 0
        return routed(*args, **kwargs)

    F.scaled_dot_product_attention = counting
    transformer.register_forward_hook(lambda *_: setattr(F, "scaled_dot_product_attention", routed))
    return calls


def patches_over_unchanged_latents(patches: int = 3):
    """PipeFusion 2 with the stale state as fresh as can be: a kept whole-image forward, then each patch's forward
    on the same latents. Returns (each patch's rows of the output, the same rows of the whole forward) on the last
    stage, None elsewhere: stale summaries and halo rows equal to fresh ones must give the whole image's output."""
    from meshdit.distributed.comm import split_sizes

    pipe = tiny_pipeline("sana-4blocks")
    pipe.set_progress_bar_config(disable=True)
    config, settings = split_layout(dict(pipefusion_parallel_degree=2))
    engine = Engine(pipe, mesh_for(config))
    parallel, seq = engine._parallel, engine._parallel.sequence_state
    req = request(NAME, *SIZE, **settings)
    try:
        with torch.inference_mode():
            state = engine.recipe.prepare(req, torch.Generator().manual_seed(req.seed), torch.device("cpu"))
            inputs = engine.recipe.model_inputs(state, state.latents, state.timesteps[0], COND)
            rows, cols = engine.recipe.token_grid(state)
            sizes = split_sizes(rows, patches)
            windows = [(sum(sizes[:p]), sum(sizes[:p + 1])) for p in range(patches)]
            seq.patch_windows = tuple((r0 * cols, r1 * cols) for r0, r1 in windows)
            stale = parallel.pipefusion.stale_kv
            stale.keep = True
            with stale.for_branch(COND), seq.patch_window(0, rows * cols):
                whole = pipe.transformer(**inputs, return_dict=False)[0]
            parts = []
            for r0, r1 in windows:
                with stale.for_branch(COND), seq.patch_window(r0 * cols, r1 * cols):
                    parts.append(pipe.transformer(**inputs, return_dict=False)[0][:, :, r0:r1])
            stale.reset()
            parallel.pipefusion.channel.finish()  # stage 0's sends complete before its engine closes
        if not parallel.pipefusion.is_last:
            return None
        return torch.cat(parts, dim=2), whole
    finally:
        engine.close()
