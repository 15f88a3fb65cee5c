"""--offload blocks: the blocks' weights wait in host memory; at most two blocks on the device; images bit for bit
those without offload, serial and under every method it composes with."""
import numpy as np
import pytest

from meshdit.config import ParallelConfig
from meshdit.engine_settings import EngineSettings
from meshdit.errors import ConfigError
from meshdit.loading import LoadOptions
from tests.parallel import offload_jobs

NAME = "flux-4blocks"
LAYOUTS = {
    "serial": {},
    "ulysses2": dict(ulysses_degree=2),
    "ring2": dict(ring_degree=2),
    "tp2": dict(tensor_parallel_degree=2),
    "pp2-full-warmup": dict(pipefusion_parallel_degree=2, warmup_steps=2),
    "cfg2": dict(cfg_degree=2),
}


@pytest.mark.parametrize("layout", list(LAYOUTS), ids=list(LAYOUTS))
def test_offloaded_blocks_give_the_same_image(run_ranks, layout):
    degrees = LAYOUTS[layout]
    world = ParallelConfig(**{k: v for k, v in degrees.items() if k.endswith("degree")}).world_size
    run = (lambda *a: [offload_jobs.image(*a)]) if world == 1 else (lambda *a: run_ranks(world, offload_jobs.image, *a))
    plain = run(NAME, degrees, None)
    offloaded = run(NAME, degrees, "blocks")
    for rank, ((want, *_), (got, most, blocks, resident, _)) in enumerate(zip(plain, offloaded)):
        assert np.array_equal(got, want), f"{layout}, rank {rank}: offload changed the image"
        assert blocks > 0 and most <= 2, f"{layout}, rank {rank}: {most} of {blocks} blocks on the device at once"
        # between calls only the first block stays, prefetched for the next call
        assert resident <= 1, f"{layout}, rank {rank}: {resident} blocks left on the device after the run"


def test_a_skipped_block_drops_its_prefetch():
    """With the step cache skipping the middle blocks, the block prefetched for a skipped one leaves the device."""
    cache = dict(method="dbcache", threshold=1.0, front_blocks=1, back_blocks=1, warmup=1)
    want = offload_jobs.image(NAME, {}, None, cache)[0]
    got, most, _, resident, cached = offload_jobs.image(NAME, {}, "blocks", cache)
    assert cached > 0, "the cache skipped no step: the test would not exercise a dropped prefetch"
    assert np.array_equal(got, want) and most <= 2 and resident <= 1


def test_offloaded_fp8_blocks_give_the_same_image():
    """FP8 GEMMs quantize the blocks' Linear layers first; offload then moves their FP8 weights and scales."""
    want = offload_jobs.image(NAME, {}, None, fp8_gemm=True)[0]
    got, most, blocks, resident, _ = offload_jobs.image(NAME, {}, "blocks", fp8_gemm=True)
    assert np.array_equal(got, want) and blocks > 0 and most <= 2 and resident <= 1


def test_offload_with_compile_is_refused_before_ranks_start():
    settings = EngineSettings("unused", ParallelConfig(compile="inductor"), "float32",
                              loading=LoadOptions(offload="blocks"))
    with pytest.raises(ConfigError, match="--offload blocks with --compile"):
        settings.validate()
