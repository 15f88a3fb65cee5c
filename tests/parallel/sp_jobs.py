"""Jobs the sequence-parallel tests run on every rank of the pool (module-level: they are pickled)."""
import torch

from meshdit.config import GenerateRequest
from meshdit.engine import Engine
from meshdit.denoising.recipe import COND
from meshdit.testing.rank_pool import mesh_for, split_layout
from meshdit.models.registry import family_for_pipeline
from meshdit.models.tiny.flux import tiny_flux_pipeline
from meshdit.testing.tiny_models import sample_image, scaled_size, tiny_pipeline, tiny_tests

_PIPES: dict = {}
MAX_SEQ = 6  # text tokens: 6 (Flux), 77 + 6 = 83 (SD3): not divisible by 4


def pipeline(name: str):
    if name not in _PIPES:
        _PIPES[name] = tiny_pipeline(name)
        _PIPES[name].set_progress_bar_config(disable=True)
    return _PIPES[name]


def request(name: str, height: int, width: int, seed: int = 3, steps: int = 2, prompts=None,
            per_prompt: int = 1, **settings) -> GenerateRequest:
    """height and width as written for 4-pixel tokens (scaled_size: the same token grid for every family)."""
    prompts = prompts or ["a red cat on a blue square"]
    height, width = scaled_size(name, height, width)
    tests = tiny_tests(name)  # the family's test settings
    extra = {} if _fixed_text_length(name) else {"max_sequence_length": MAX_SEQ}
    extra.update(tests.request_extra)
    if tests.prompt_embeds:  # a tiny pipeline without a text encoder: fixed prompt embeddings, one row per prompt
        extra["prompt_embeds"] = torch.randn(len(prompts), *tests.prompt_embeds,
                                             generator=torch.Generator().manual_seed(7))
    edits = type(pipeline(name)).__name__ in family_for_pipeline(type(pipeline(name)).__name__).images.edit_pipelines
    settings.setdefault("image", sample_image(height, width) if edits else None)  # an edit pipeline's input image
    return GenerateRequest(prompt=prompts, height=height, width=width, num_inference_steps=steps, seed=seed,
                           guidance_scale=tests.guidance, num_images_per_prompt=per_prompt, extra=extra, **settings)


def image_test_size(name: str, height: int, width: int) -> tuple[int, int]:
    """An image test's size (written for 4-pixel tokens) for pipeline `name`: a video family's tokens are 16
    pixels wide, so it gets 4 x the size, the same token grid per frame (request() then scales as for any name)."""
    video = family_for_pipeline(type(pipeline(name)).__name__).is_video
    return (4 * height, 4 * width) if video else (height, width)


def _fixed_text_length(name: str) -> bool:
    """The family takes no --max-sequence-length (HunyuanDiT: its transformer's text length is fixed)."""
    return family_for_pipeline(type(pipeline(name)).__name__).is_text_length_fixed(pipeline(name).transformer.config)


def generate(name: str, ring: int, ulysses: int, height: int, width: int, seed: int = 3):
    """Returns (transformer output at the first step, final image) computed over the mesh."""
    return generate_layout(name, dict(ring_degree=ring, ulysses_degree=ulysses), height, width, seed)


def generate_layout(name: str, degrees: dict, height: int, width: int, seed: int = 3, prompts=None,
                    per_prompt: int = 1, vae: dict | None = None):
    """generate() for any layout, e.g. degrees=dict(cfg_degree=2, ring_degree=2); vae: VaeDecodeSettings fields."""
    from meshdit.vae import VaeDecodeSettings

    pipe = pipeline(name)
    config, settings = split_layout(degrees)
    mesh = mesh_for(config) if config.world_size > 1 else None
    engine = Engine(pipe, mesh, VaeDecodeSettings(**(vae or {})))
    try:
        req = request(name, height, width, seed, prompts=prompts, per_prompt=per_prompt, **settings)
        with torch.inference_mode():
            state = engine.recipe.prepare(req, torch.Generator().manual_seed(seed), torch.device("cpu"))
            inputs = engine.recipe.model_inputs(state, state.latents, state.timesteps[0], COND)
            transformer_out = pipe.transformer(**inputs, return_dict=False)[0]
            if isinstance(transformer_out, list):  # Z-Image: one tensor per sample
                transformer_out = torch.stack(transformer_out)
        image = engine.generate(req).images
        return transformer_out, image
    finally:
        engine.close()


def generate_fresh(name: str, degrees: dict, height: int, width: int, seed: int = 3, prompts=None, steps: int = 2):
    """Like generate_layout on a pipeline built for this call (PipeFusion drops other stages' blocks).

    Returns (final image, parameter bytes this rank holds in transformer blocks, in the rest of the transformer).
    """
    pipe = tiny_pipeline(name)
    pipe.set_progress_bar_config(disable=True)
    config, settings = split_layout(degrees)
    engine = Engine(pipe, mesh_for(config) if config.world_size > 1 else None)
    try:
        image = engine.generate(request(name, height, width, seed, steps=steps, prompts=prompts, **settings)).images
    finally:
        engine.close()
    block_bytes = other_bytes = 0
    for pname, param in pipe.transformer.named_parameters():
        nbytes = param.numel() * param.element_size()
        if "transformer_blocks." in pname:
            block_bytes += nbytes
        else:
            other_bytes += nbytes
    return image, block_bytes, other_bytes


def stale_kv_held(name: str, height: int, width: int, steps: int) -> tuple[int, int]:
    """PipeFusion 2 with 1 warmup step: (most stale K/V buffers held during the generate, held after it)."""
    pipe = tiny_pipeline(name)
    pipe.set_progress_bar_config(disable=True)
    config, settings = split_layout(dict(pipefusion_parallel_degree=2, warmup_steps=1))
    engine = Engine(pipe, mesh_for(config))
    stale_kv, most = engine._parallel.pipefusion.stale_kv, [0]
    attention = stale_kv.attention

    def counting(*args):  # every stale-K/V attention call: how many buffers are live then
        out = attention(*args)
        most[0] = max(most[0], len(stale_kv.buffers))
        return out

    stale_kv.attention = counting
    try:
        engine.generate(request(name, height, width, steps=steps, **settings))
        return most[0], len(stale_kv.buffers)
    finally:
        engine.close()


def engine_refusal(degrees: dict):
    """Engine(pipe, mesh) on a layout the model cannot take: (error type, message, hooks left on the transformer)."""
    from meshdit.errors import ConfigError

    pipe = tiny_flux_pipeline(double=1, single=0)  # one block: PipeFusion 2 has no block for its second stage
    try:
        Engine(pipe, mesh_for(split_layout(degrees)[0])).close()
        error = None
    except ConfigError as exc:
        error = (type(exc).__name__, str(exc))
    hooks = sum(len(m._forward_hooks) + len(m._forward_pre_hooks) for m in pipe.transformer.modules())
    return error, hooks


def sdpa_after_close(degrees: dict):
    """(SDPA routed while an engine is open, torch's own SDPA back after the last engine closes)."""
    import torch.nn.functional as F

    from meshdit.attention.router import TORCH_SDPA

    config = split_layout(degrees)[0]
    first = Engine(pipeline("flux"), mesh_for(config))
    second = Engine(tiny_pipeline("flux"), mesh_for(config))
    first.close()
    still_routed = F.scaled_dot_product_attention is not TORCH_SDPA  # the second engine still needs it
    second.close()
    return still_routed, F.scaled_dot_product_attention is TORCH_SDPA
