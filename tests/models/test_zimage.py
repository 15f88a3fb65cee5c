"""What Z-Image adds to the parametrised tests (which run its tiny pipeline under every layout): a batch of two
prompts whose joint sequences differ in length, so every main layer's attention gets a key mask (KeyMask: K/V
gathered over the SP ranks), equal to one process under Ulysses 2, Ring 2 and Ring 2 x Ulysses 2; a wrong choice in
its plan (the main layers' attention left to each rank's shard, or the rotary table split for the first layer only)
fails; and the Engine's refusals of what it does not run, before ranks start."""
import dataclasses

import numpy as np
import pytest

from meshdit.config import GenerateRequest, ParallelConfig
from meshdit.errors import ConfigError, RankFailedError
from meshdit.models.info import ModelInfo
from meshdit.testing.tiny_models import tiny_pipeline
from tests.models import zimage_jobs

_SERIAL: dict = {}


def serial():
    if "image" not in _SERIAL:
        _SERIAL["image"] = zimage_jobs.two_prompts({})
    return _SERIAL["image"]


@pytest.mark.parametrize("degrees", [dict(ulysses_degree=2), dict(ring_degree=2),
                                     dict(ring_degree=2, ulysses_degree=2)], ids=["u2", "r2", "r2u2"])
def test_masked_batch_equals_one_process(run_ranks, degrees):
    expected = serial()
    assert expected.shape == (2, 36, 44, 3)
    world = ParallelConfig(**degrees).world_size
    for rank, image in enumerate(run_ranks(world, zimage_jobs.two_prompts, degrees)):
        error = float(np.abs(image - expected).max())
        assert error <= 1e-5 * float(np.abs(expected).max()), f"rank {rank}: max abs diff {error}"


@pytest.mark.parametrize("variant", ["local-layers", "freqs-once"])
def test_a_wrong_plan_fails(run_ranks, variant):
    try:
        results = run_ranks(2, zimage_jobs.two_prompts, dict(ulysses_degree=2), 0.0, variant)
    except RankFailedError:  # the rotary table whole against a shard of tokens: a shape error on the ranks
        return
    assert all(float(np.abs(image - serial_turbo()).max()) > 1e-3 for image in results), variant


def serial_turbo():
    if "turbo" not in _SERIAL:
        _SERIAL["turbo"] = zimage_jobs.two_prompts({}, 0.0)
    return _SERIAL["turbo"]


def test_engine_refuses_what_it_does_not_run():
    info = ModelInfo.from_pipeline(tiny_pipeline("zimage"))
    for key in ("cfg_normalization", "cfg_truncation", "sigmas"):
        with pytest.raises(ConfigError, match=key):
            info.check_call_arguments(GenerateRequest(prompt="a cat", extra={key: 0.5}))
    omni = dict(info.transformer_config, siglip_feat_dim=16)
    with pytest.raises(ConfigError, match="siglip_feat_dim"):
        dataclasses.replace(info, transformer_config=omni).check_frames_and_image(GenerateRequest(prompt="a cat"))
