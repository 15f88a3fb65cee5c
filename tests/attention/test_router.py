"""The attention seam guarded (attention/router.py, parallel/sequence.py's seam guard, plan.NotSdpa).

Sequence parallelism and PipeFusion are right only if every plan-marked attention module computes its
attention through torch's SDPA, which the router sends to Ulysses / ring / stale-K/V attention. A module
whose processor attends another way (here diffusers' classic AttnProcessor: baddbmm, softmax, bmm) would
attend over its own rank's tokens only; the run must stop naming it instead of writing a wrong image.
"""
import pytest
import torch

from meshdit.errors import RankFailedError
from tests.attention import router_jobs

BYPASS = "transformer_blocks.1.attn1"  # PixArt's image self-attention of the second block (PipeFusion: stage 1)


@pytest.mark.parametrize("degrees", [dict(ulysses_degree=2), dict(pipefusion_parallel_degree=2, warmup_steps=2),
                                     dict(ulysses_degree=2, compile="aot_eager")],
                         ids=["ulysses2", "pipefusion2", "ulysses2-compiled"])
def test_attention_that_bypasses_sdpa_stops_the_run_naming_the_module(run_ranks, degrees):
    with pytest.raises(RankFailedError, match=rf"attention module {BYPASS} \(AttnProcessor\) ran without calling "
                                              r"torch's scaled_dot_product_attention"):
        run_ranks(2, router_jobs.generate, degrees, (BYPASS,))


def test_sdpa_path_and_serial_bypass_still_run(run_ranks):
    """The same model with SDPA processors under Ulysses 2 equals one process; the matmul processor is fine
    where nothing is split (one process)."""
    (serial,) = run_ranks(1, router_jobs.generate, dict())
    (serial_matmul,) = run_ranks(1, router_jobs.generate, dict(), (BYPASS,))
    torch.testing.assert_close(serial_matmul, serial, rtol=0, atol=1e-5)
    for image in run_ranks(2, router_jobs.generate, dict(ulysses_degree=2)):
        torch.testing.assert_close(image, serial, rtol=0, atol=1e-5)


def test_not_sdpa_module_made_parallel_by_its_exchange(run_ranks):
    """NotSdpa: the matmul processor, made sequence-parallel by gathering its K/V projections, equals one process."""
    for out, expected in run_ranks(2, router_jobs.transformer_output, dict(ulysses_degree=2), (BYPASS,), (BYPASS,)):
        torch.testing.assert_close(out, expected, rtol=0, atol=1e-5 * expected.abs().max().item())


def test_not_sdpa_module_that_calls_sdpa_is_refused(run_ranks):
    with pytest.raises(RankFailedError, match=rf"attention module {BYPASS} called torch's "
                                              r"scaled_dot_product_attention, but the plan marks it NotSdpa"):
        run_ranks(2, router_jobs.transformer_output, dict(ulysses_degree=2), (), (BYPASS,))
