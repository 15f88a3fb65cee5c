"""Memory-efficient replicated load: weights bit-identical to from_pretrained, images equal to plain-load images."""
import pytest

from tests.loading import jobs


@pytest.mark.parametrize("transport", ["shared", "broadcast"])
def test_weights_and_images_equal_plain_load(run_ranks, flux_folder, transport):
    for rank, (differing, diff, tensors) in enumerate(
            run_ranks(2, jobs.efficient_vs_plain, flux_folder, dict(ulysses_degree=2), transport)):
        assert tensors > 0, f"rank {rank} loaded nothing"
        assert differing == [], f"rank {rank}: {differing[:5]}"
        assert diff == 0.0, f"rank {rank}"
