"""N-branch guidance on the cfg axis: SD3's skip-layer guidance (3 branches on some steps) dealt round-robin over
cfg 2 and cfg 3 equals one process; degrees the request's branches cannot use are refused before ranks start."""
import numpy as np
import pytest
import torch

from meshdit.config import GenerateRequest, ParallelConfig
from meshdit.errors import ConfigError
from meshdit.models.info import ModelInfo
from meshdit.models.tiny.sd3 import SKIP_LAYER_GUIDANCE
from meshdit.parallel.cfg import BranchExchange, owner
from meshdit.testing.tiny_models import tiny_pipeline
from tests.parallel import cfg_jobs

# 3 steps: step 0 runs uncond and cond, steps 1 and 2 add the skip-layer pass (SKIP_LAYER_GUIDANCE's window)
SLG = {k: v for k, v in SKIP_LAYER_GUIDANCE.items()}
_SERIAL: dict = {}


def serial(extra_key: str):
    if extra_key not in _SERIAL:
        _SERIAL[extra_key] = cfg_jobs.generate_with_extra("sd35", {}, SLG if extra_key == "slg" else {})[0]
    return _SERIAL[extra_key]


def test_skip_layer_guidance_changes_the_image():
    """The third branch does something (else the parallel cases below could not fail)."""
    assert np.abs(serial("slg") - serial("cfg")).max() > 1e-3


@pytest.mark.parametrize("degrees", [dict(cfg_degree=3), dict(cfg_degree=2), dict(cfg_degree=3, ulysses_degree=2)],
                         ids=["cfg3", "cfg2-uneven", "cfg3-u2"])
def test_skip_layer_guidance_over_the_cfg_axis_equals_serial(run_ranks, degrees):
    world = ParallelConfig(**degrees).world_size
    results = run_ranks(world, cfg_jobs.generate_with_extra, "sd35", degrees, SLG)
    ref = serial("slg")
    for rank, (images, sent) in enumerate(results):
        assert images.shape == ref.shape
        assert np.abs(images - ref).max() <= 1e-5 * np.abs(ref).max(), f"rank {rank}: images differ"
        assert sent.get("all_gather", 0) > 0, f"rank {rank} exchanged no prediction"


def test_skip_layer_guidance_with_data_parallelism_equals_serial(run_ranks):
    """Each data-parallel group slices the skip-layer branch with the others (two prompts over two groups)."""
    prompts = ["a red cat", "a blue square on a white background"]
    ref = cfg_jobs.generate_with_extra("sd35", {}, SLG, prompts=prompts)[0]
    for rank, (images, _) in enumerate(run_ranks(2, cfg_jobs.generate_with_extra, "sd35",
                                                 dict(data_parallel_degree=2), SLG, prompts=prompts)):
        assert np.abs(images - ref).max() <= 1e-5 * np.abs(ref).max(), f"rank {rank}: images differ"


def test_plain_cfg_over_two_ranks_still_sends_one_prediction_per_step(run_ranks):
    """cfg 2 without the extra pass: one slot per rank and step, no dtype agreement (the bytes of before)."""
    results = run_ranks(2, cfg_jobs.generate_with_extra, "sd35", dict(cfg_degree=2), {})
    ref = serial("cfg")
    latent = 1 * 4 * 18 * 22 * 4  # one prediction [1, C, h, w] float32: 36 x 44 px over the VAE's factor 2
    for images, sent in results:
        assert np.abs(images - ref).max() <= 1e-5 * np.abs(ref).max()
        assert "cfg_dtype" not in sent
        assert sent["all_gather"] == 3 * latent  # 3 steps, one prediction to the one peer each


def test_branches_are_dealt_round_robin():
    assert [owner(j, 2) for j in range(3)] == [0, 1, 0]
    assert [owner(j, 3) for j in range(3)] == [0, 1, 2]
    alone = BranchExchange(["uncond", "cond"], None)  # one rank: its own predictions, unchanged
    preds = {"uncond": torch.zeros(1), "cond": torch.ones(1)}
    assert alone(preds, ["uncond", "cond"], torch.zeros(1)) is preds


@pytest.fixture(scope="module")
def info():
    return ModelInfo.from_pipeline(tiny_pipeline("sd35"))


def _request(**extra):
    return GenerateRequest(prompt="a cat", height=32, width=32, guidance_scale=5.0, extra=extra)


def test_skip_layer_defaults_are_the_pipelines():
    import inspect

    from diffusers import StableDiffusion3Pipeline

    from meshdit.models.sd3 import SKIP_LAYER_DEFAULTS

    parameters = inspect.signature(StableDiffusion3Pipeline.__call__).parameters
    assert SKIP_LAYER_DEFAULTS == {key: parameters[key].default for key in SKIP_LAYER_DEFAULTS}


def test_branch_counts(info):
    assert info.guidance_branches(5.0) == 2
    assert info.guidance_branches(5.0, SLG) == 3
    assert info.guidance_branches(1.0, SLG) == 1  # the pipeline applies skip-layer guidance only with CFG
    info.check_request(ParallelConfig(cfg_degree=3), _request(**SLG))


@pytest.mark.parametrize("config,extra,match", [
    (dict(cfg_degree=3), {}, r"--cfg-degree 3 needs at least 3 guidance branches.*runs 2.*skip_guidance_layers"),
    (dict(cfg_degree=4), SLG, r"--cfg-degree 4 needs at least 4 guidance branches.*runs 3"),
    (dict(cfg_degree=2), dict(SLG, skip_guidance_layers=[2]), r"block indices 0\.\.1"),
    (dict(cfg_degree=2), dict(SLG, skip_guidance_layers="1"), r"block indices"),
    (dict(pipefusion_parallel_degree=2), SLG, r"PipeFusion's stages cannot skip"),
    (dict(), dict(SLG, skip_layer_guidance_stop="0.5"), r"skip_layer_guidance_stop='0.5': give a finite number"),
], ids=["cfg3-without-a-third-branch", "cfg4-over-three", "layer-out-of-range", "layers-not-a-list", "pipefusion",
        "stop-not-a-number"])
def test_refusals(info, config, extra, match):
    with pytest.raises(ConfigError, match=match):
        info.check_request(ParallelConfig(**config), _request(**extra))


def test_cache_with_skip_layer_guidance_refused(info):
    from meshdit.cache_settings import CacheSettings

    request = GenerateRequest(prompt="a cat", height=32, width=32, guidance_scale=5.0, extra=SLG,
                              cache=CacheSettings(method="fbcache"))
    with pytest.raises(ConfigError, match="step cache"):
        info.check_request(ParallelConfig(), request)


def test_degrees_beyond_four_refused_with_the_flag():
    with pytest.raises(ConfigError, match="--cfg-degree 5: no family runs more than 4"):
        ParallelConfig(cfg_degree=5).validate()
    with pytest.raises(ConfigError, match="--cfg-degree must be a whole number"):
        ParallelConfig(cfg_degree=0).validate()
