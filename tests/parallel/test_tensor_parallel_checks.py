"""Tensor parallelism's refusals before ranks start (torch-free: ModelInfo, ParallelConfig), and the registry's
tp flag against the families' plans."""
import pytest

from meshdit.config import ParallelConfig
from meshdit.mesh_axes import MESH_AXES, MeshAxis
from meshdit.errors import ConfigError
from meshdit.models.info import ModelInfo
from meshdit.models.registry import FAMILIES, family_for_pipeline

FLUX_CONFIG = {"num_attention_heads": 6, "attention_head_dim": 16, "num_layers": 1, "num_single_layers": 1}


def flux_info(pipeline="FluxPipeline", config=FLUX_CONFIG) -> ModelInfo:
    return ModelInfo("<test>", pipeline, family_for_pipeline(pipeline), dict(config), 8)


def test_tp_is_the_innermost_axis_and_in_the_world_size():
    assert MESH_AXES[-1] is MeshAxis.TP
    config = ParallelConfig(tensor_parallel_degree=2, ulysses_degree=2)
    assert config.world_size == 4 and config.describe() == "ulysses2 x tp2"
    with pytest.raises(ConfigError, match="--tensor-parallel-degree must be a whole number"):
        ParallelConfig(tensor_parallel_degree=0).validate()


def test_more_tp_ranks_than_heads_is_refused_naming_the_flag():
    flux_info().check_layout(ParallelConfig(tensor_parallel_degree=6))  # one head each: fine
    with pytest.raises(ConfigError, match=r"--tensor-parallel-degree <= 6"):
        flux_info().check_layout(ParallelConfig(tensor_parallel_degree=8))


def test_ulysses_is_bounded_by_the_heads_a_tp_rank_holds():
    flux_info().check_layout(ParallelConfig(tensor_parallel_degree=2, ulysses_degree=3))
    with pytest.raises(ConfigError, match=r"under --tensor-parallel-degree 2\).*--ulysses-degree <= 3"):
        flux_info().check_layout(ParallelConfig(tensor_parallel_degree=2, ulysses_degree=4))


def test_a_family_without_a_tensor_plan_is_refused_naming_the_flag():
    info = ModelInfo("<test>", "LTXPipeline", family_for_pipeline("LTXPipeline"),
                     {"num_attention_heads": 4, "num_layers": 2}, 8)
    with pytest.raises(ConfigError, match="drop --tensor-parallel-degree"):
        info.check_layout(ParallelConfig(tensor_parallel_degree=2))


@pytest.mark.parametrize("family", FAMILIES, ids=lambda f: f.name)
def test_the_registry_flag_matches_the_plans(family):
    """tensor_parallel is True exactly where the family has a TensorPlan with styles or its transformer class
    carries diffusers' _tp_plan (FLUX.2 and FLUX.1 read theirs)."""
    import diffusers

    plan = family.plan().tensor
    has_plan = (plan is not None and bool(plan.styles)) or bool(
        getattr(getattr(diffusers, family.transformer_class), "_tp_plan", None))
    assert family.parallel.tensor == has_plan
