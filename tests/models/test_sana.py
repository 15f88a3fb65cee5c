"""SANA beyond the parametrised family tests: its linear attention goes through the K.V-summary exchange (never
SDPA), the Mix-FFN conv needs its halo rows, the seam guard catches an exchange that does nothing, and the
refusals before ranks start."""
import numpy as np
import pytest
import torch

from meshdit.config import ParallelConfig
from meshdit.errors import ConfigError, RankFailedError
from meshdit.models.info import ModelInfo
from meshdit.testing.tiny_models import tiny_pipeline
from tests.models import sana_jobs

SELF_ATTENTION = "transformer_blocks.0.attn1"


def _close(out, expected):
    return (out - expected).abs().max().item() <= 1e-5 * expected.abs().max().item()


@pytest.mark.parametrize("degrees,summaries,all_to_all", [
    (dict(ring_degree=2), True, False), (dict(ulysses_degree=2), False, True),
    (dict(ring_degree=2, ulysses_degree=2), True, True)], ids=["r2", "u2", "r2u2"])
def test_linear_attention_exchanges_summaries_not_kv_and_never_calls_sdpa(run_ranks, degrees, summaries,
                                                                          all_to_all):
    """Ring: one all-reduce of the [B, H, D + 1, D] summary (float64) per self-attention and nothing else of the
    attention crosses; Ulysses: the all-to-all by heads, no summary exchange; the Mix-FFN's halo rows travel;
    attn1 makes no SDPA call; the output equals one process."""
    world = degrees.get("ring_degree", 1) * degrees.get("ulysses_degree", 1)
    for out, expected, sent, sdpa_calls in run_ranks(world, sana_jobs.transformer_output, degrees):
        assert _close(out, expected)
        assert sdpa_calls == 0
        assert sent.get("sequence_halo", 0) > 0
        assert ("all_to_all" in sent) == all_to_all
        if summaries:  # 2 blocks x (cond) batch 1 x 4 heads / U x 5 x 4 float64, 2 (r - 1) / r of it sent
            heads = 4 // degrees.get("ulysses_degree", 1)
            assert sent["linear_attention_summary"] == 2 * heads * 5 * 4 * 8
        else:
            assert "linear_attention_summary" not in sent
        assert "ring_p2p" not in sent  # K/V blocks never travel


def test_an_exchange_that_does_nothing_stops_the_run(run_ranks):
    with pytest.raises(RankFailedError, match=rf"attention module {SELF_ATTENTION} \(SanaLinearAttnProcessor2_0\).*"
                                              r"ran without its sequence-parallel exchange"):
        run_ranks(2, sana_jobs.transformer_output, dict(ulysses_degree=2), "no-exchange")


def test_self_attention_given_an_sdpa_processor_is_refused(run_ranks):
    """SanaAttnProcessor2_0 (softmax attention through SDPA) is not the arithmetic the exchange repeats."""
    with pytest.raises(RankFailedError, match=rf"{SELF_ATTENTION}: its processor SanaAttnProcessor2_0 is not the "
                                              "linear attention"):
        run_ranks(2, sana_jobs.transformer_output, dict(ring_degree=2), "plan", "SanaAttnProcessor2_0")


def test_without_halo_rows_the_conv_is_wrong_at_band_edges(run_ranks):
    """The RowHalo is what makes the bands exact: without it the Mix-FFN's 3x3 conv pads band edges with zeros."""
    for out, expected, sent, _ in run_ranks(2, sana_jobs.transformer_output, dict(ulysses_degree=2), "no-halo"):
        assert not _close(out, expected)
        assert "sequence_halo" not in sent


@pytest.fixture(scope="module")
def info():
    return ModelInfo.from_pipeline(tiny_pipeline("sana"))


def test_fewer_token_rows_than_sp_ranks_refused(info):
    with pytest.raises(ConfigError, match=r"2 rows of image tokens, fewer than the 4 sequence-parallel ranks"):
        info.check(ParallelConfig(ulysses_degree=4), 8, 64, 4.5)


def test_patches_with_fewer_rows_than_sp_ranks_refused(info):
    with pytest.raises(ConfigError, match=r"smallest of 3 patches has 1 rows of image tokens, fewer than the 2"):
        info.check(ParallelConfig(pipefusion_parallel_degree=2, ulysses_degree=2), 20, 64, 4.5, patches=3)


def test_sana_vae_factor_read_from_its_dc_ae_config(info):
    assert info.vae_scale_factor == tiny_pipeline("sana").vae_scale_factor == 4


def test_summary_exchanging_processor_equals_diffusers_alone():
    """With no SP ranks (groups of one) the exchanging processor is diffusers' linear attention."""
    from meshdit.attention.linear import SummaryExchangingLinearAttention
    from meshdit.attention.usp import SequenceGroups
    from meshdit.parallel.sequence import _SequenceState

    attn = tiny_pipeline("sana").transformer.transformer_blocks[0].attn1
    x = torch.randn(2, 30, 16, generator=torch.Generator().manual_seed(0))
    state = _SequenceState(SequenceGroups(None, 1, None, 1), None, 0, 1)
    state.stream_lens["img"] = [5]
    state.row_width["img"] = 6
    with torch.inference_mode():
        expected = attn(x)
        attn.set_processor(SummaryExchangingLinearAttention(state, "attn1", ("img",)))
        torch.testing.assert_close(attn(x), expected, rtol=1e-6, atol=1e-6)


def test_pipefusion_stale_state_as_fresh_gives_the_whole_image(run_ranks):
    """PipeFusion's stale K.V summaries (each patch's share) and Mix-FFN halo rows: patches over the latents a
    kept whole-image forward just saw give that forward's output (so the one-warmup-step error is staleness)."""
    results = [r for r in run_ranks(2, sana_jobs.patches_over_unchanged_latents) if r is not None]
    assert results
    for patched, whole in results:
        assert _close(patched, whole)


@pytest.mark.parametrize("other", [dict(ulysses_degree=2), dict(ring_degree=2), dict(cfg_degree=2)],
                         ids=["u2", "r2", "cfg2"])
def test_pipefusion_hybrids_with_full_warmup_equal_serial(run_ranks, other):
    """PipeFusion 2 with SP or CFG inside, full warmup: bands of rows per stage, exact (36 x 44: 9 token rows)."""
    from tests.parallel import sp_jobs

    ref = sp_jobs.generate_fresh("sana-4blocks", {}, *sana_jobs.SIZE, steps=3)[0]
    degrees = dict(pipefusion_parallel_degree=2, warmup_steps=3, num_pipeline_patch=2, **other)
    for image, _, _ in run_ranks(4, sp_jobs.generate_fresh, "sana-4blocks", degrees, *sana_jobs.SIZE, steps=3):
        assert np.abs(image - ref).max() <= 1e-5 * np.abs(ref).max()


def test_planner_costs_linear_attention_and_never_splits_the_dc_ae(tmp_path):
    """meshdit plan on SANA: self-attention FLOPs grow with the tokens, not their square; no layout decodes with
    --use-parallel-vae or tiles (refused for the DC-AE)."""
    from meshdit.config import GenerateRequest
    from meshdit.planner.choose import load_model, make_plan
    from meshdit.planner.hardware import world_from
    from meshdit.testing.save_tiny import main as save_tiny

    save_tiny(["sana", str(tmp_path / "sana")])
    _, _, costs = load_model(str(tmp_path / "sana"))
    one, four = (costs.step_flops(n, 6, 1)[1] for n in (99, 396))
    assert four == pytest.approx(4 * one, rel=0.05)  # cross-attention to 6 text tokens and the summary: linear
    plan = make_plan(costs.info, costs, GenerateRequest(prompt=["a cat"], height=36, width=44),
                     world_from("h100-sxm", 4, 1))
    assert plan.rows and all(row.layout.vae == "plain" for row in plan.rows)
