"""CFG parallel and data parallel, alone and with sequence parallelism: N ranks equal one process."""
import numpy as np
import pytest

from meshdit.config import ParallelConfig
from meshdit.errors import ConfigError
from meshdit.models.info import ModelInfo
from meshdit.testing.tiny_models import tiny_families, tiny_pipeline
from tests.parallel import sp_jobs

PROMPTS = ["a red cat", "a blue square on a white background", "two green circles"]  # 3: uneven over 2 groups
_REFERENCE: dict = {}


def reference(name, prompts, per_prompt):
    key = (name, tuple(prompts), per_prompt)
    if key not in _REFERENCE:
        _REFERENCE[key] = sp_jobs.generate_layout(name, {}, 36, 44, prompts=prompts, per_prompt=per_prompt)[1]
    return _REFERENCE[key]


def check(results, ref):
    for rank, (_, images) in enumerate(results):
        assert images.shape == ref.shape, f"rank {rank}: {images.shape} != {ref.shape}"
        assert np.abs(images - ref).max() <= 1e-5 * np.abs(ref).max(), f"rank {rank}: images differ"


CASES = {
    # id: (degrees, prompts, images per prompt)
    "cfg2": (dict(cfg_degree=2), PROMPTS[:1], 1),
    "dp2-3prompts": (dict(data_parallel_degree=2), PROMPTS, 1),
    "dp2-2images": (dict(data_parallel_degree=2), PROMPTS[:1], 2),
    "cfg2-u2": (dict(cfg_degree=2, ulysses_degree=2), PROMPTS[:1], 1),
    "dp2-r2": (dict(data_parallel_degree=2, ring_degree=2), PROMPTS, 1),
    "cfg2-r2-u2": (dict(cfg_degree=2, ring_degree=2, ulysses_degree=2), PROMPTS[:1], 1),  # eight ranks
}
# every image family under the cases its tiny pipeline takes (TinyTests.layouts: HunyuanDiT's DDPM draws noise in
# every step, so data parallelism is refused; FLUX.2 is guidance-distilled, so it has no CFG branch to split)
FAMILY_CASES = [(module.TESTS.main, case) for _, module in tiny_families(video=False)
                for case in (CASES if module.TESTS.layouts is None else module.TESTS.layouts)]


@pytest.mark.parametrize("name,case", FAMILY_CASES, ids=[f"{name}-{case}" for name, case in FAMILY_CASES])
def test_layout_equals_single_process(run_ranks, name, case):
    degrees, prompts, per_prompt = CASES[case]
    world = ParallelConfig(**degrees).world_size
    results = run_ranks(world, sp_jobs.generate_layout, name, degrees, 36, 44, prompts=prompts,
                        per_prompt=per_prompt)
    check(results, reference(name, prompts, per_prompt))


def test_data_parallel_refused_where_the_scheduler_draws_noise_in_each_step():
    info = ModelInfo.from_pipeline(tiny_pipeline("hunyuandit"))
    assert info.scheduler_class == "DDPMScheduler"
    with pytest.raises(ConfigError, match="DDPMScheduler draws fresh noise in every step.*Drop --data-parallel"):
        info.check(ParallelConfig(data_parallel_degree=2), 64, 64, num_images=2)
    info.check(ParallelConfig(cfg_degree=2), 64, 64, num_images=2)  # CFG parallel: both ranks draw the same


@pytest.mark.parametrize("name", ["flux2", "flux-distilled"])
def test_cfg_parallel_refused_for_guidance_distilled_models(name):
    info = ModelInfo.from_pipeline(tiny_pipeline(name))
    with pytest.raises(ConfigError, match="guidance-distilled.*Drop --use-cfg-parallel"):
        info.check(ParallelConfig(cfg_degree=2), 32, 32)


def test_cfg_parallel_refused_without_guidance():
    info = ModelInfo.from_pipeline(tiny_pipeline("sd35"))
    with pytest.raises(ConfigError, match="guidance scale 1.0 turns classifier-free guidance off"):
        info.check(ParallelConfig(cfg_degree=2), 32, 32, guidance_scale=1.0)


def test_more_data_parallel_groups_than_images_refused():
    info = ModelInfo.from_pipeline(tiny_pipeline("sd35"))
    with pytest.raises(ConfigError, match="data-parallel degree 4 needs at least as many images"):
        info.check(ParallelConfig(data_parallel_degree=4), 32, 32, num_images=3)
