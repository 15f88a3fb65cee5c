"""Ulysses, Ring and USP on every model family: N ranks equal one process (fp32)."""
import numpy as np
import pytest
import torch

from meshdit.errors import ConfigError
from meshdit.testing.tiny_models import tiny_families
from meshdit.vae.settings import UNSPLIT_VAE_REASONS, VaeDecodeSettings, check_vae_config
from tests.parallel import sp_jobs

LAYOUTS = [(1, 2), (2, 1), (2, 2), (1, 4), (4, 1)]  # (ring, ulysses)
SIZES = [(32, 32), (36, 44)]  # square (even splits), non-square 9x11 = 99 tokens: divides by neither 2 nor 4
FAMILIES = [module.TESTS.main for _, module in tiny_families(video=False)]  # every image family's tiny pipeline
VARIANTS = [name for _, module in tiny_families(video=False) for name in module.TESTS.variants]

_REFERENCE: dict = {}


def reference(name, height, width, seed=3):
    key = (name, height, width, seed)
    if key not in _REFERENCE:
        _REFERENCE[key] = sp_jobs.generate(name, 1, 1, height, width, seed)
    return _REFERENCE[key]


def assert_equal_to_reference(results, ref):
    ref_out, ref_image = ref
    for rank, (out, image) in enumerate(results):
        tol_out = 1e-5 * ref_out.abs().max().item()
        assert (out - ref_out).abs().max().item() <= tol_out, f"rank {rank}: transformer output differs"
        tol_img = 1e-5 * float(np.abs(ref_image).max())
        assert float(np.abs(image - ref_image).max()) <= tol_img, f"rank {rank}: image differs"


@pytest.mark.parametrize("size", SIZES, ids=lambda s: f"{s[0]}x{s[1]}")
@pytest.mark.parametrize("layout", LAYOUTS, ids=lambda l: f"r{l[0]}u{l[1]}")
@pytest.mark.parametrize("name", FAMILIES)
def test_layout_equals_single_process(run_ranks, name, layout, size):
    ring, ulysses = layout
    results = run_ranks(ring * ulysses, sp_jobs.generate, name, ring, ulysses, *size)
    assert_equal_to_reference(results, reference(name, *size))


@pytest.mark.parametrize("name", FAMILIES)
def test_parallel_vae_under_ulysses_equals_single_process(run_ranks, name):
    """--use-parallel-vae splits the decode into row bands over the image group: exact; a VAE it cannot split
    exactly (SANA's DC-AE) is refused from its config before ranks start, with the reason."""
    vae = sp_jobs.pipeline(name).vae
    if type(vae).__name__ in UNSPLIT_VAE_REASONS:
        vae_config = {**vae.config, "_class_name": type(vae).__name__}  # as vae/config.json has it
        with pytest.raises(ConfigError, match=rf"--use-parallel-vae cannot decode this model's "
                                              rf"{type(vae).__name__} exactly"):
            check_vae_config(vae_config, VaeDecodeSettings(parallel=True), 36, 44)
        return
    results = run_ranks(2, sp_jobs.generate_layout, name, dict(ulysses_degree=2), 36, 44, vae=dict(parallel=True))
    assert_equal_to_reference(results, reference(name, 36, 44))


@pytest.mark.parametrize("name", VARIANTS)
def test_other_pipelines_of_the_families(run_ranks, name):
    results = run_ranks(4, sp_jobs.generate, name, 2, 2, 36, 44)
    assert_equal_to_reference(results, reference(name, 36, 44))


@pytest.mark.parametrize("layout", [(1, 4), (2, 2)], ids=["u4", "r2u2"])
def test_heads_not_divisible_by_ulysses(run_ranks, layout):
    """6 heads over 4 Ulysses ranks: uneven head shards [2, 2, 1, 1], still exact."""
    results = run_ranks(4, sp_jobs.generate, "flux-6heads", *layout, 36, 44)
    assert_equal_to_reference(results, reference("flux-6heads", 36, 44))


def test_same_seed_same_image_and_seed_matters(run_ranks):
    a = run_ranks(2, sp_jobs.generate, "flux", 2, 1, 32, 32, 11)[0][1]
    b = run_ranks(4, sp_jobs.generate, "flux", 2, 2, 32, 32, 11)[0][1]
    c = run_ranks(2, sp_jobs.generate, "flux", 1, 2, 32, 32, 12)[0][1]
    assert np.abs(a - b).max() <= 1e-5
    assert np.abs(a - c).max() > 1e-3  # a different seed draws a different image


def test_sdpa_is_torch_own_again_after_the_last_engine_closes(run_ranks):
    """The SDPA routing is reference-counted by engines: closing one keeps it for the other, the last restores it."""
    for still_routed, restored in run_ranks(2, sp_jobs.sdpa_after_close, dict(ulysses_degree=2)):
        assert still_routed and restored
