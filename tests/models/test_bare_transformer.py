"""Every family's bare transformer, called as diffusers' own transformer tests call it (their dummy inputs, at
batch 2: each tiny module's diffusers_test_inputs), under Ulysses 2 and ring 2 equals the one-process forward. The
pipe-native path calls transformers with whatever shapes their pipelines pass, not only meshdit's recipes' shapes:
LTX's [B] timestep was cut across the batch as if it were per token (its split had no expected_dims guard)."""
import pytest

from meshdit.testing.tiny_models import tiny_families
from tests.models import transformer_jobs

FAMILIES = {family.name: (module.__name__, module.TESTS.main) for family, module in tiny_families()}
LAYOUTS = {"u2": dict(ulysses_degree=2), "r2": dict(ring_degree=2)}
_SERIAL: dict = {}


def serial(family):
    if family not in _SERIAL:
        _SERIAL[family] = transformer_jobs.bare_forward(*FAMILIES[family], {}, hooked=False)
    return _SERIAL[family]


@pytest.mark.parametrize("layout", list(LAYOUTS))
@pytest.mark.parametrize("family", list(FAMILIES))
def test_bare_transformer_with_diffusers_test_inputs_equals_one_process(run_ranks, family, layout):
    expected = serial(family)
    assert expected.shape[0] == transformer_jobs.BATCH
    results = run_ranks(2, transformer_jobs.bare_forward, *FAMILIES[family], LAYOUTS[layout])
    for rank, out in enumerate(results):
        assert out.shape == expected.shape, f"rank {rank}"
        error = (out - expected).abs().max().item()
        assert error <= 1e-5 * expected.abs().max().item(), f"rank {rank}: max abs diff {error}"
