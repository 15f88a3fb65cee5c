import pytest

from meshdit.testing.rank_pool import close_all_pools, get_pool
from meshdit.testing.save_tiny import saved_tiny


@pytest.fixture(scope="session")
def run_ranks():
    """run_ranks(n, fn, *args, timeout=..., **kwargs) -> per-rank results, on a shared pool of n gloo ranks."""

    def run(world_size, fn, *args, **kwargs):
        return get_pool(world_size).run(fn, *args, **kwargs)

    yield run
    close_all_pools()


@pytest.fixture(scope="session")
def tiny_folder(tmp_path_factory):
    """tiny_folder(name, seed=0) -> the path (str) of tiny pipeline `name` saved as a model folder, saved once per
    session per (name, seed) and shared: read it, never write into it (copy it to change a file)."""
    root = str(tmp_path_factory.mktemp("tiny-models"))
    return lambda name, seed=0: saved_tiny(name, root, seed)


@pytest.fixture(scope="session")
def tiny_flux_dir(tiny_folder):
    """The tiny FLUX.1 pipeline's folder (the CLI and fault tests' model)."""
    return tiny_folder("flux")


@pytest.fixture(scope="session")
def flux_folder(tiny_folder):
    """The tiny FLUX.1 pipeline with 2 double + 2 single blocks (the loading tests' model: blocks to split)."""
    return tiny_folder("flux-4blocks")
