"""--text-encoder-parallel: each rank holds one contiguous run of every text encoder's layers; the embeddings and
the image equal one process's."""
import numpy as np
import pytest
import torch

from meshdit.config import ParallelConfig
from meshdit.engine_settings import EngineSettings
from meshdit.errors import ConfigError
from meshdit.loading import LoadOptions
from meshdit.loading.text_stages import stage_of
from tests.loading import jobs


@pytest.mark.parametrize("efficient", [True, False], ids=["lean", "plain"])
def test_split_encoders_give_one_process_embeddings_with_a_share_of_the_layers(run_ranks, flux_folder, efficient):
    reference = jobs.one_process_embeddings(flux_folder)
    image = jobs.single_process_image(flux_folder)
    results = run_ranks(2, jobs.split_encoder_embeddings, flux_folder, dict(ulysses_degree=2), efficient)
    for rank, (embeddings, held, whole, rank_image) in enumerate(results):
        for got, want in zip(embeddings, reference):
            assert torch.equal(got, want), f"rank {rank}: embeddings differ from the one-process encoder's"
        for name, params in held.items():
            per_layer = whole[name]
            stage = sum(p for i, p in enumerate(per_layer) if stage_of(i, len(per_layer), 2) == rank)
            assert params == stage < sum(per_layer), f"rank {rank} holds {params} {name} layer parameters, " \
                f"its stage {stage} of {sum(per_layer)}"
        diff = np.abs(rank_image - image).max()
        assert diff <= 1e-5 * np.abs(image).max(), f"rank {rank}: image differs by {diff}"


def test_a_failing_layer_stops_every_rank_with_its_error(run_ranks, flux_folder):
    messages = run_ranks(2, jobs.failing_encoder_layer, flux_folder)
    assert "layer broke" in messages[1]
    assert "text encoder layer" in messages[0] and "on rank 1 failed" in messages[0] and "layer broke" in messages[0]


def test_stages_are_contiguous_and_balanced():
    owners = [stage_of(i, 24, 5) for i in range(24)]
    assert owners == sorted(owners) and set(owners) == set(range(5))
    assert max(owners.count(s) for s in range(5)) - min(owners.count(s) for s in range(5)) <= 1


@pytest.mark.parametrize("loading, world, message", [
    (LoadOptions(text_encoder_parallel=True), 1, "this run has one rank"),
    (LoadOptions(text_encoder_parallel=True, text_encoder_device="cpu"), 2, "drop one of them"),
])
def test_bad_combinations_are_refused_before_ranks_start(loading, world, message):
    settings = EngineSettings("unused", ParallelConfig(ulysses_degree=world), "float32", loading=loading)
    with pytest.raises(ConfigError, match=message):
        settings.validate()
