"""Jobs the video tests run on every rank of the pool (module-level: they are pickled)."""
import torch

from dataclasses import replace

from meshdit.config import GenerateRequest
from meshdit.denoising.recipe import COND
from meshdit.engine import Engine
from meshdit.models.registry import family_for_pipeline
from meshdit.testing.rank_pool import mesh_for, split_layout
from meshdit.testing.tiny_models import sample_image, scaled_size, tiny_pipeline, tiny_tests

# 9 frames -> 3 latent frames; 48 x 80 px -> 3 x 5 tokens per frame: 45 tokens, divisible by neither 2 nor 4
# (uneven shards everywhere), and 9 token rows for PipeFusion's patches (3 patches of 3 rows cross no frame
# boundary; 2 patches of 5 + 4 rows do).
FRAMES, HEIGHT, WIDTH = 9, 48, 80
TEXT = 6  # max_sequence_length, kept small for speed


def size(name: str) -> tuple[int, int]:
    """(height, width) in pixels of the tests' 3 x 5 tokens per frame for pipeline `name` (tokens wider than
    Wan's 16 pixels, LTX's 32, scaled: TinyTests.token_scale)."""
    return scaled_size(name, HEIGHT, WIDTH)


_PIPES: dict = {}


def request(name: str, pipe, prompts=None, steps: int = 2, seed: int = 3) -> GenerateRequest:
    """An image-to-video pipeline (Wan I2V) animates sample_image(); a model with a fixed text length (Wan I2V: 512,
    CogVideoX's sin-cos table: its max_text_seq_length, HunyuanVideo 1.5: 1000) takes its default length."""
    family = family_for_pipeline(type(pipe).__name__)
    i2v = type(pipe).__name__ in family.video.image_to_video_pipelines
    height, width = size(name)
    extra = {} if family.is_text_length_fixed(pipe.transformer.config) else {"max_sequence_length": TEXT}
    extra.update(tiny_tests(name).request_extra)
    return GenerateRequest(prompt=prompts or ["a red cat on a blue square"], height=height, width=width,
                           num_frames=FRAMES, num_inference_steps=steps, seed=seed,
                           image=sample_image(height, width) if i2v else None,
                           extra=extra)


def generate(name: str, layout: dict, prompts=None, steps: int = 2, fresh: bool = False, vae: dict | None = None,
             fields: dict | None = None):
    """(transformer output at the first step [B, C, F, h, w] (LTX: [B, S, C]), final video [N, F, H, W, 3], what parallelize
    installed on a second expert) over the mesh.

    fresh: a pipeline built for this call (PipeFusion drops other stages' blocks for good);
    vae: VaeDecodeSettings fields (e.g. parallel=True: the video decoded in row bands over the image group);
    fields: GenerateRequest fields that replace request()'s (e.g. guidance_scale, extra)."""
    from meshdit.vae import VaeDecodeSettings

    if fresh:
        pipe = tiny_pipeline(name)
    else:
        pipe = _PIPES.setdefault(name, tiny_pipeline(name))
    pipe.set_progress_bar_config(disable=True)
    config, settings = split_layout(layout)  # degrees; PipeFusion's warmup steps and patches (request fields)
    engine = Engine(pipe, mesh_for(config) if config.world_size > 1 else None, VaeDecodeSettings(**(vae or {})))
    try:
        req = replace(request(name, pipe, prompts, steps), **settings, **(fields or {}))
        out = None
        if config.pipefusion_parallel_degree == 1:  # a lone forward needs every block on this rank
            with torch.inference_mode():
                state = engine.recipe.prepare(req, torch.Generator().manual_seed(req.seed), torch.device("cpu"))
                t = state.timesteps[0]
                inputs = engine.recipe.model_inputs(state, state.latents, t, COND)
                out = engine.recipe.transformer_for(state, t)(**inputs, return_dict=False)[0]
        video = engine.generate(req).images
        return out, video, _second_expert_parallel(pipe)
    finally:
        engine.close()


def _second_expert_parallel(pipe) -> dict:
    """Hooks on transformer_2's modules and its stand-in blocks (PipeFusion): a second expert left out of
    parallelize would still compute the right video (every rank holds the whole latents), so its output
    alone cannot tell."""
    from meshdit.parallel.pipefusion import SkipBlock

    second = getattr(pipe, "transformer_2", None)
    if second is None:
        return {}
    return dict(hooks=sum(len(m._forward_pre_hooks) + len(m._forward_hooks) for m in second.modules()),
                skipped=sum(isinstance(m, SkipBlock) for m in second.modules()))
