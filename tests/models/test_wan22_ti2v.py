"""Wan 2.2 TI2V-5B (WanPipeline / WanImageToVideoPipeline with expand_timesteps): a timestep per token, split with
the video tokens (as diffusers' _cp_plan splits it), so each rank's per-token modulation covers its own tokens.
Every exact layout equals one process on tests/models/test_video.py's token grid (3 latent frames of 3 x 5 tokens:
45, no degree divides them), text-to-video and image-to-video (the image's latents as the first latent frame, its
tokens at timestep 0); degree 1 is diffusers' own (tests/models/test_diffusers_guard.py)."""
import pytest
import torch

from tests.models import video_jobs
from tests.models.test_video import LAYOUTS, PIPEFUSION, check, reference, world

EXACT = {"u2": LAYOUTS["u2"], "r2": LAYOUTS["r2"], "r2u2": LAYOUTS["r2u2"], "cfg2": LAYOUTS["cfg2"],
         "pf2": dict(PIPEFUSION, num_pipeline_patch=2), "vae": dict(ulysses_degree=2)}
CASES = [(name, layout) for name in ("wan22-ti2v", "wan22-ti2v-i2v") for layout in EXACT]


@pytest.mark.parametrize("name,layout", CASES, ids=[f"{name}-{layout}" for name, layout in CASES])
def test_ti2v_equals_one_process_under_every_layout(run_ranks, name, layout):
    """PipeFusion (2 stages of the 4-block build, full warmup): each patch takes its run of the per-token
    timesteps; vae: --use-parallel-vae, the 48-channel patchified residual VAE decoded in row bands."""
    degrees = EXACT[layout]
    pipefusion = "pipefusion_parallel_degree" in degrees
    build = f"{name}-4blocks" if pipefusion else name
    vae = dict(parallel=True) if layout == "vae" else None
    check(run_ranks(world(degrees), video_jobs.generate, build, degrees, fresh=pipefusion, vae=vae),
          reference(build), build)


@pytest.mark.parametrize("name", ["wan22-ti2v", "wan22-ti2v-i2v"])
def test_ti2v_data_parallel_equals_one_process(run_ranks, name):
    """3 videos over 2 groups: the image's latents are cut with the batch, the first-frame mask ([1, ...]) is not."""
    prompts = ["a red cat", "a blue dog", "two green circles"]
    check(run_ranks(2, video_jobs.generate, name, dict(data_parallel_degree=2), prompts),
          reference(name, prompts), name)


def test_image_to_video_gives_the_first_frame_tokens_timestep_zero():
    """The per-token timestep the split serves: [B, 45], the first latent frame's 15 tokens at 0 (image-to-video),
    every token at t (text-to-video)."""
    from meshdit.denoising.recipe import COND
    from meshdit.engine import Engine
    from meshdit.testing.tiny_models import tiny_pipeline

    for name, first in (("wan22-ti2v-i2v", 0.0), ("wan22-ti2v", None)):
        pipe = tiny_pipeline(name)
        engine = Engine(pipe)
        try:
            with torch.inference_mode():
                state = engine.recipe.prepare(video_jobs.request(name, pipe), torch.Generator().manual_seed(3),
                                              torch.device("cpu"))
                t = state.timesteps[0]
                timestep = engine.recipe.model_inputs(state, state.latents, t, COND)["timestep"]
        finally:
            engine.close()
        assert timestep.shape == (1, 45)
        assert torch.equal(timestep[:, :15], torch.full((1, 15), t.item() if first is None else first))
        assert torch.equal(timestep[:, 15:], torch.full((1, 30), t.item()))
