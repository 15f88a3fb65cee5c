"""A split operand of size 1 on its split dim is broadcast by the model over every token: each rank (and each
PipeFusion patch) keeps it whole. HunyuanDiT's rotary table has one row when the pipeline's grid arithmetic
(which assumes a VAE factor of 8) gives a 1 x 1 grid, as in diffusers' own HunyuanDiT tests."""
import numpy as np
import pytest
import torch

from meshdit.testing.rank_pool import split_layout
from tests.parallel import sp_jobs

NAME = "hunyuandit-vae2-4blocks"
SIZE = (20, 28)  # 5 x 7 = 35 image tokens (divides by no degree); the rotary grid is 20 // 16 x 28 // 16 = 1 x 1
STEPS = 3


def one_row_rotary():
    """(rotary rows, image tokens) the recipe gives the transformer at SIZE."""
    from meshdit.engine import Engine

    engine = Engine(sp_jobs.pipeline(NAME))
    try:
        state = engine.recipe.prepare(sp_jobs.request(NAME, *SIZE), torch.Generator().manual_seed(0),
                                      torch.device("cpu"))
        return state.extra["rotary"][0].shape[0], state.latents.shape[-2] * state.latents.shape[-1] // 4
    finally:
        engine.close()


def test_the_tiny_model_has_a_one_row_rotary_table():
    assert one_row_rotary() == (1, 35)


@pytest.mark.parametrize("degrees", [dict(ulysses_degree=2), dict(ring_degree=2),
                                     dict(pipefusion_parallel_degree=2, warmup_steps=STEPS, num_pipeline_patch=2)],
                         ids=["u2", "r2", "pf2"])
def test_one_row_rotary_equals_serial(run_ranks, degrees):
    ref = sp_jobs.generate_fresh(NAME, {}, *SIZE, steps=STEPS)[0]
    world = split_layout(degrees)[0].world_size
    for rank, (image, _, _) in enumerate(run_ranks(world, sp_jobs.generate_fresh, NAME, degrees, *SIZE,
                                                   steps=STEPS, timeout=120)):
        assert image.shape == ref.shape
        assert np.abs(image - ref).max() <= 1e-5 * np.abs(ref).max(), f"rank {rank}"


def one_text_token_image(degrees: dict):
    """Flux with one text token: a stream's own single token, which is split (one rank holds it), not a table."""
    from dataclasses import replace

    from meshdit.engine import Engine
    from meshdit.testing.rank_pool import mesh_for
    from meshdit.testing.tiny_models import tiny_pipeline

    config, settings = split_layout(degrees)
    engine = Engine(tiny_pipeline("flux"), mesh_for(config) if config.world_size > 1 else None)
    try:
        request = replace(sp_jobs.request("flux", 32, 32, **settings), extra={"max_sequence_length": 1})
        return engine.generate(request).images
    finally:
        engine.close()


@pytest.mark.parametrize("degrees", [dict(ulysses_degree=2), dict(ring_degree=2)], ids=["u2", "r2"])
def test_a_stream_of_one_token_is_still_split(run_ranks, degrees):
    ref = one_text_token_image({})
    for rank, image in enumerate(run_ranks(2, one_text_token_image, degrees, timeout=120)):
        assert np.abs(image - ref).max() <= 1e-5 * np.abs(ref).max(), f"rank {rank}"
