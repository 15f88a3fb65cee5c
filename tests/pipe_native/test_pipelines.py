"""Every pipeline class verified pipe-native (meshdit/pipe_native/support.VERIFIED): diffusers' own `pipe(...)`,
parallelized over 2 gloo ranks, equals the plain call in one process (<= 1e-5 x its largest value) under each of
its layouts; the step cache equals the cached one-process run."""
import pytest

from meshdit.pipe_native.support import VERIFIED
from tests.pipe_native import jobs
from tests.pipe_native.cases import CASES

TOLERANCE = 1e-5


def test_every_verified_class_has_a_case():
    assert set(VERIFIED) <= set(CASES)


GROUPS = {
    # variants run several to a pool job (one job's overhead): their tiny pipelines are small
    "flux-control": ["FluxControlPipeline", "FluxControlImg2ImgPipeline", "FluxControlInpaintPipeline",
                     "FluxFillPipeline", "VisualClozeGenerationPipeline", "VisualClozePipeline"],
    "flux-controlnet": ["FluxControlNetPipeline", "FluxControlNetImg2ImgPipeline", "FluxControlNetInpaintPipeline"],
    "controlnet": ["StableDiffusion3ControlNetPipeline", "StableDiffusion3ControlNetInpaintingPipeline",
                   "QwenImageControlNetPipeline", "QwenImageControlNetInpaintPipeline", "SanaControlNetPipeline",
                   "HunyuanDiTControlNetPipeline"],
    "pag": ["PixArtSigmaPAGPipeline", "HunyuanDiTPAGPipeline"],
    "video": ["CogVideoXVideoToVideoPipeline", "CogVideoXFunControlPipeline", "WanVideoToVideoPipeline",
              "LucyEditPipeline", "HunyuanSkyreelsImageToVideoPipeline", "LTXI2VLongMultiPromptPipeline"],
    "distilled": ["Flux2KleinPipeline", "Flux2KleinInpaintPipeline", "SanaSprintPipeline",
                  "SanaSprintImg2ImgPipeline"],
}
GROUPED = {name for names in GROUPS.values() for name in names}


@pytest.mark.parametrize("name", sorted(set(VERIFIED) - GROUPED))
def test_pipe_native_equals_one_process(run_ranks, name):
    results = run_ranks(2, jobs.run_case, name, list(VERIFIED[name]))
    for rank, differences in enumerate(results):
        assert differences and all(d <= TOLERANCE for d in differences.values()), f"rank {rank}: {differences}"


@pytest.mark.parametrize("group", sorted(GROUPS))
def test_grouped_variants_equal_one_process(run_ranks, group):
    for rank, by_class in enumerate(run_ranks(2, jobs.run_cases, GROUPS[group])):
        for name, differences in by_class.items():
            assert differences and all(d <= TOLERANCE for d in differences.values()), \
                f"rank {rank}, {name}: {differences}"


def test_every_grouped_class_is_verified():
    assert GROUPED <= set(VERIFIED)


def test_lora_through_diffusers_after_parallelize(run_ranks, tmp_path):
    """pipe.load_lora_weights / set_adapters after meshdit.parallelize: peft wraps the Linears under the hooks."""
    for difference, effect in run_ranks(2, jobs.lora_after_parallelize, str(tmp_path)):
        assert difference <= TOLERANCE and effect > 1e-3


def test_unparallelize_restores_the_pipeline(run_ranks):
    assert all(run_ranks(2, jobs.unparallelize_restores, "FluxPipeline"))
