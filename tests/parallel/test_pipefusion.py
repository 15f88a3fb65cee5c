"""PipeFusion: exact with full warmup; bounded error with one warmup step; a stage's weights only; no hang."""
import numpy as np
import pytest

from meshdit.config import GenerateRequest
from meshdit.errors import ConfigError, RankFailedError
from meshdit.models.info import ModelInfo
from meshdit.parallel.pipefusion import balanced_stages, block_weight
from meshdit.testing.rank_pool import split_layout
from meshdit.testing.tiny_models import tiny_families, tiny_pipeline
from tests.parallel import sp_jobs

STEPS = 4
SIZE = (36, 44)  # 9 x 11 image tokens: patches of uneven height
# Error bound of stale K/V with one warmup step, as PSNR of the image against the serial image
# (pixels in [0, 1]). Measured 61-93 dB on these tiny random models (docs/pipefusion.md); the bound keeps margin.
MIN_PSNR_DB = 50.0
# HunyuanDiT's tiny model (DDIM, v-prediction, 4 steps 250 timesteps apart) changes more from step to step,
# so its K/V go staler: measured 49-51 dB with the drift correction, 35-37 dB without (74-78 dB with 3
# warmup steps).
# SANA's tiny model (FlowMatch shift 7: its last step is the largest) measured 38.7-39.0 dB on every layout below
# (74 dB with 3 warmup steps); its stale state is each patch's share of the linear attention's K.V summary and the
# Mix-FFN's neighbour rows, with no drift correction.
# Z-Image's caption rides after the grid in the one split stream, so only the last patch computes it fresh and the
# earlier patches read its K/V a step stale: measured 48.8-51.6 dB.
MIN_PSNR_DB_OF = {"hunyuandit-4blocks": 45.0, "sana-4blocks": 35.0, "zimage-4blocks": 45.0}
# What the drift correction (StaleKV.drift_correction, on by default) gains where the K/V go stalest:
# measured +7.9 dB (SD3.5) and +14.4 dB (HunyuanDiT) with PipeFusion 2 and 3 patches.
MIN_DRIFT_GAIN_DB = 5.0
_REFERENCE: dict = {}


def reference(name):
    if name not in _REFERENCE:
        _REFERENCE[name] = sp_jobs.generate_fresh(name, {}, *SIZE, steps=STEPS)[0]
    return _REFERENCE[name]


def psnr(a, b):
    mse = float(((a - b) ** 2).mean())
    return float("inf") if mse == 0 else 10 * np.log10(1.0 / mse)


def run(run_ranks, name, **degrees):
    world = split_layout(degrees)[0].world_size
    return run_ranks(world, sp_jobs.generate_fresh, name, degrees, *SIZE, steps=STEPS)


FAMILIES_4 = [module.TESTS.four_blocks for _, module in tiny_families(video=False)]  # every image family's


@pytest.mark.parametrize("stages", [2, 4])
@pytest.mark.parametrize("name", FAMILIES_4)
def test_full_warmup_equals_serial(run_ranks, name, stages):
    ref = reference(name)
    for rank, (image, _, _) in enumerate(run(run_ranks, name, pipefusion_parallel_degree=stages,
                                             warmup_steps=STEPS, num_pipeline_patch=3)):
        assert np.abs(image - ref).max() <= 1e-5 * np.abs(ref).max(), f"rank {rank}"


@pytest.mark.parametrize("other", [dict(ulysses_degree=2), dict(ring_degree=2), dict(cfg_degree=2),
                                   dict(data_parallel_degree=2)], ids=["u2", "r2", "cfg2", "dp2"])
@pytest.mark.parametrize("name", ["flux-4blocks", "sd35-4blocks", "pixart-sigma-4blocks"])
def test_hybrids_with_full_warmup_equal_serial(run_ranks, name, other):
    prompts = ["a red cat", "a blue dog"] if "data_parallel_degree" in other else None
    ref = sp_jobs.generate_fresh(name, {}, *SIZE, steps=STEPS, prompts=prompts)[0]
    degrees = dict(pipefusion_parallel_degree=2, warmup_steps=STEPS, **other)
    world = split_layout(degrees)[0].world_size
    results = run_ranks(world, sp_jobs.generate_fresh, name, degrees, *SIZE, steps=STEPS, prompts=prompts)
    for rank, (image, _, _) in enumerate(results):
        assert image.shape == ref.shape
        assert np.abs(image - ref).max() <= 1e-5 * np.abs(ref).max(), f"rank {rank}"


# the layouts of the one-warmup-step bound (also benchmarks.pipefusion_drift's)
ONE_WARMUP_LAYOUTS = {"pp2-m3": dict(pipefusion_parallel_degree=2, num_pipeline_patch=3),
                      "pp4-m4": dict(pipefusion_parallel_degree=4, num_pipeline_patch=4),
                      "pp2-u2": dict(pipefusion_parallel_degree=2, ulysses_degree=2),
                      "pp2-r2": dict(pipefusion_parallel_degree=2, ring_degree=2)}


@pytest.mark.parametrize("layout", list(ONE_WARMUP_LAYOUTS.values()), ids=list(ONE_WARMUP_LAYOUTS))
@pytest.mark.parametrize("name", FAMILIES_4)
def test_one_warmup_step_error_is_bounded(run_ranks, name, layout):
    ref = reference(name)
    results = run(run_ranks, name, warmup_steps=1, **layout)
    for rank, (image, _, _) in enumerate(results):
        quality = psnr(image, ref)
        assert MIN_PSNR_DB_OF.get(name, MIN_PSNR_DB) <= quality, f"rank {rank}: PSNR {quality:.1f} dB"
        assert np.abs(image - ref).max() > 1e-6, "stale K/V should make PipeFusion differ from serial"


@pytest.mark.parametrize("name", ["sd35-4blocks", "hunyuandit-4blocks"])
def test_drift_correction_shrinks_the_stale_error(run_ranks, name):
    """Shifting the later patches' stale values by the mean change the fresh patch measured in its own brings
    PipeFusion closer to serial; --no-kv-drift-correction gives PipeFusion as published."""
    layout = dict(pipefusion_parallel_degree=2, num_pipeline_patch=3, warmup_steps=1)
    on, off = (run(run_ranks, name, kv_drift_correction=correct, **layout) for correct in (True, False))
    for rank in range(2):
        gain = psnr(on[rank][0], reference(name)) - psnr(off[rank][0], reference(name))
        assert gain >= MIN_DRIFT_GAIN_DB, f"rank {rank}: {gain:.1f} dB"


def test_stale_values_shift_by_the_mean_change_of_the_fresh_patch():
    """Only the later patches' values move (text and earlier patches are fresh), each by the same
    per-head, per-channel amount; after the last patch nothing is stale."""
    import torch

    from meshdit.attention.stale_kv import _shift_stale_values

    torch.manual_seed(0)
    values = torch.randn(1, 2, 12, 4)  # [B, H, 2 text + 10 image tokens, D]
    last = values[:, :, 5:8].clone()  # image tokens 3..6: the patch, as computed in the last step
    values[:, :, 5:8] += torch.randn(1, 2, 3, 4)  # ... and as computed now
    before = values.clone()
    _shift_stale_values(values, last, image_start=2, patch=(3, 6), image_len=10)
    drift = (before[:, :, 5:8] - last).mean(2, keepdim=True)  # [1, 2, 1, 4]
    assert torch.equal(values[:, :, :8], before[:, :, :8])
    assert torch.allclose(values[:, :, 8:], before[:, :, 8:] + drift)
    # the last patch (StaleKV does not call it there): no later tokens, so nothing moves, the patch included
    _shift_stale_values(values, values[:, :, 9:].clone() - 1, image_start=2, patch=(7, 10), image_len=10)
    assert torch.equal(values[:, :, 8:], (before[:, :, 8:] + drift))


@pytest.mark.parametrize("name", ["flux-4blocks", "sd35-4blocks", "hunyuandit-4blocks"])
def test_stale_kv_error_depends_on_patches_not_stages(run_ranks, name):
    """Stage boundaries only carry activations: with M patches a patch sees the same fresh and stale K/V
    however many stages run the blocks, so PipeFusion 2 and 4 with 3 patches give one image (the error
    above is the patches', and the PipeFusion 4 default, 4 patches, is staler than PipeFusion 2's 2)."""
    two, four = (run(run_ranks, name, pipefusion_parallel_degree=stages, num_pipeline_patch=3, warmup_steps=1)
                 for stages in (2, 4))
    assert np.abs(two[0][0] - reference(name)).max() > 1e-6, "stale K/V should make PipeFusion differ from serial"
    for stages, results in ((2, two), (4, four)):  # the same arithmetic in the same order: bit for bit
        for rank, (image, _, _) in enumerate(results):
            assert np.array_equal(image, two[0][0]), f"{stages} stages, rank {rank}"


def test_stale_kv_are_freed_when_denoising_ends(run_ranks):
    """The buffers belong to one generation: not held through the VAE decode or until the next request."""
    for rank, (during, after) in enumerate(run_ranks(2, sp_jobs.stale_kv_held, "flux-4blocks", *SIZE, STEPS)):
        assert during > 0 and after == 0, f"rank {rank}: {during} buffers during, {after} after"


@pytest.mark.parametrize("name", ["pixart-sigma-4blocks"])  # equal blocks: an exact quarter is possible
def test_each_rank_holds_a_quarter_of_the_blocks(run_ranks, name):
    _, all_blocks, _ = sp_jobs.generate_fresh(name, {}, *SIZE, steps=1)
    for rank, (_, blocks, rest) in enumerate(run_ranks(4, sp_jobs.generate_fresh, name,
                                                         dict(pipefusion_parallel_degree=4), *SIZE, steps=1)):
        assert blocks <= all_blocks / 4, f"rank {rank} holds {blocks} of {all_blocks} block bytes"
        assert rest > 0  # embeddings and output layers stay on every rank


def test_stage_that_raises_ends_the_job_without_hang(run_ranks):
    """Stage 0 then waits for activations that never come: the job still ends, naming stage 1's rank."""
    with pytest.raises(RankFailedError, match=r"(?s)rank\(s\) \[1\].*failure injected at step 2"):
        run_ranks(2, _generate_with_env, "pixart-sigma-4blocks", {"MESHDIT_FAIL_AT_STEP": "1:2"}, timeout=120)


def _generate_with_env(name, env):
    import os

    os.environ.update(env)
    try:
        return sp_jobs.generate_fresh(name, dict(pipefusion_parallel_degree=2), *SIZE, steps=STEPS)
    finally:
        for key in env:
            os.environ.pop(key, None)


def test_flux_stages_balance_image_token_work():
    """A Flux double block has 2.4x a single block's parameters (a text stream, two modulations) but the
    same work per image token: PipeFusion 2 puts two blocks on each stage, not one and three."""
    transformer = tiny_pipeline("flux-4blocks").transformer
    blocks = [*transformer.transformer_blocks, *transformer.single_transformer_blocks]
    assert balanced_stages([block_weight(b) for b in blocks], 2) == [2, 2]


def test_balanced_stages_by_weight():
    assert balanced_stages([1, 1, 1, 1], 4) == [1, 1, 1, 1]
    assert balanced_stages([4, 1, 1, 1, 1], 2) == [1, 4]
    with pytest.raises(ValueError, match="at least as many blocks"):
        balanced_stages([1, 1], 3)


@pytest.mark.parametrize("degrees,size,message", [
    (dict(pipefusion_parallel_degree=4), (32, 32), "needs a block per stage, but the model has 2 blocks"),
    (dict(pipefusion_parallel_degree=2, num_pipeline_patch=9), (32, 32), "exceeds the 8 rows of image tokens"),
], ids=["stages-above-blocks", "patches-above-rows"])
def test_bad_pipefusion_layouts_refused(degrees, size, message):
    info = ModelInfo.from_pipeline(tiny_pipeline("pixart-sigma"))
    config, settings = split_layout(degrees)
    with pytest.raises(ConfigError, match=message):
        info.check_request(config, GenerateRequest(prompt="a cat", height=size[0], width=size[1], **settings))


def test_pipefusion_with_ulysses_and_ring_full_warmup_equals_serial(run_ranks):
    ref = reference("flux-4blocks")
    results = run(run_ranks, "flux-4blocks", pipefusion_parallel_degree=2, ulysses_degree=2, ring_degree=2,
                  warmup_steps=STEPS)
    for rank, (image, _, _) in enumerate(results):
        assert np.abs(image - ref).max() <= 1e-5 * np.abs(ref).max(), f"rank {rank}"


def test_python_api_refuses_a_layout_the_model_cannot_take_before_installing_hooks(run_ranks):
    """Engine(pipe, mesh) raises the CLI's ConfigError (not a bare ValueError) and leaves no hook behind."""
    for error, hooks in run_ranks(2, sp_jobs.engine_refusal, dict(pipefusion_parallel_degree=2)):
        assert error is not None and error[0] == "ConfigError"
        assert "--pipefusion-parallel-degree <= 1" in error[1]
        assert hooks == 0
