"""PipeFusion stages hold only their blocks from the start: other stages' blocks are never materialised."""
import numpy as np
import pytest

from tests.loading import jobs
from tests.parallel.sp_jobs import generate_fresh


@pytest.mark.parametrize("transport", ["shared", "broadcast"])
def test_pipefusion4_peak_parameter_bytes_within_stage(run_ranks, flux_folder, transport):
    results = run_ranks(4, jobs.pipefusion_stage_bytes, flux_folder, 4, transport)
    images = [image for *_, image in results]
    for rank, (peak, bound, whole, _) in enumerate(results):
        assert 0 < peak <= bound < whole, f"rank {rank}: peak {peak}, stage bound {bound}, whole model {whole}"
    # The stages agree on the image (full warmup: exact, as tests/parallel/test_pipefusion.py checks against serial).
    for rank, image in enumerate(images[1:], 1):
        assert np.array_equal(image, images[0]), f"rank {rank}"
