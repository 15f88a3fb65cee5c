"""Every pipeline class verified pipe-native (meshdit/pipe_native/support.VERIFIED): diffusers' own `pipe(...)`,
parallelized over 2 gloo ranks, equals the plain call in one process (<= 1e-5 x its largest value) under each of
its layouts; the step cache equals the cached one-process run."""
import pytest

from meshdit.pipe_native.support import SEQUENCE_LAYOUTS, VERIFIED
from tests.pipe_native import jobs
from tests.pipe_native.cases import CASES

TOLERANCE = 1e-5
TWO_RANKS = [layout for layout in jobs.LAYOUTS if layout not in ("usp", "cfg-ulysses")]


def layouts_of(name: str, world: int) -> list[str]:
    wanted = [layout for layout in (*SEQUENCE_LAYOUTS, *VERIFIED[name])]
    return [layout for layout in wanted if (layout in TWO_RANKS) == (world == 2)]


def test_every_verified_class_has_a_case():
    assert sorted(VERIFIED) == sorted(CASES)


@pytest.mark.parametrize("name", sorted(VERIFIED))
def test_pipe_native_equals_one_process(run_ranks, name):
    results = run_ranks(2, jobs.run_case, name, layouts_of(name, 2))
    for rank, differences in enumerate(results):
        assert differences and all(d <= TOLERANCE for d in differences.values()), f"rank {rank}: {differences}"
