"""What parallelize refuses, with the reason, before any rank joins a world (one process, no ranks)."""
import pytest

import meshdit
from meshdit.errors import ConfigError
from meshdit.testing.tiny_models import tiny_pipeline


@pytest.fixture(scope="module")
def flux():
    return tiny_pipeline("flux")


def test_cfg_refused_where_the_pipeline_calls_the_transformer_per_branch(flux):
    with pytest.raises(ConfigError, match="once per guidance branch.*Engine's recipe path"):
        meshdit.parallelize(flux, meshdit.ParallelConfig(cfg_degree=2))
    from diffusers import FluxPipeline

    assert type(flux) is FluxPipeline and meshdit.pipe_native.installed(flux) is None  # nothing left installed


@pytest.mark.parametrize("degrees, match", [
    (dict(pipefusion_parallel_degree=2), "PipeFusion drives its own loop"),
    (dict(data_parallel_degree=2), "data parallelism splits the prompts"),
])
def test_loops_of_their_own_refused(flux, degrees, match):
    with pytest.raises(ConfigError, match=match):
        meshdit.parallelize(flux, meshdit.ParallelConfig(**degrees))


def test_unsplittable_vae_and_twice_and_not_parallelized():
    sana = tiny_pipeline("sana")
    with pytest.raises(ConfigError, match="AutoencoderDC in parts exactly"):
        meshdit.parallelize(sana, vae=True)
    flux = tiny_pipeline("flux")
    with meshdit.parallelized(flux):
        with pytest.raises(ConfigError, match="parallelized already"):
            meshdit.parallelize(flux)
    with pytest.raises(ConfigError, match="is not parallelized"):
        meshdit.unparallelize(flux)


@pytest.mark.parametrize("cls, build, match", [
    ("StableDiffusion3PAGPipeline", "sd35-4blocks", "masked SDPA"),
    ("SanaPAGPipeline", "sana", "K.V-summary exchange"),
])
def test_pag_refused_under_sequence_parallelism_where_its_processors_need_it(cls, build, match):
    from tests.pipe_native.variant_cases import pag

    pipe = pag(build, cls, ["blocks.1"] if "SD3" in cls or "StableDiffusion3" in cls else
               ["transformer_blocks.0"])()
    with pytest.raises(ConfigError, match=match):
        meshdit.parallelize(pipe, meshdit.ParallelConfig(ulysses_degree=2))
    assert meshdit.pipe_native.installed(pipe) is None
