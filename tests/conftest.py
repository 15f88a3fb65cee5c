import pytest

from meshdit.testing.rank_pool import close_all_pools, get_pool


@pytest.fixture(scope="session")
def run_ranks():
    """run_ranks(n, fn, *args, timeout=..., **kwargs) -> per-rank results, on a shared pool of n gloo ranks."""

    def run(world_size, fn, *args, **kwargs):
        return get_pool(world_size).run(fn, *args, **kwargs)

    yield run
    close_all_pools()
