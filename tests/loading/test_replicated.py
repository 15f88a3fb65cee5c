"""Memory-efficient replicated load: weights bit-identical to from_pretrained, images equal to plain-load images."""
import glob

import pytest

from tests.loading import jobs


@pytest.mark.parametrize("transport, dtype", [("shared", "float32"), ("broadcast", "float32"),
                                              ("shared", "bfloat16")])  # bf16 from the fp32 file: one shared cast
def test_weights_and_images_equal_plain_load(run_ranks, flux_folder, transport, dtype):
    left = set(glob.glob("/dev/shm/meshdit-weights-*"))
    for rank, (differing, diff, tensors) in enumerate(
            run_ranks(2, jobs.efficient_vs_plain, flux_folder, dict(ulysses_degree=2), transport, dtype)):
        assert tensors > 0, f"rank {rank} loaded nothing"
        assert differing == [], f"rank {rank}: {differing[:5]}"
        assert diff == 0.0, f"rank {rank}"
    assert set(glob.glob("/dev/shm/meshdit-weights-*")) == left, "the shared cast left a file behind"


def test_one_reader_per_host(run_ranks, flux_folder):
    """Streamed loads read once per host, never across hosts: each of 2 'hosts' (MESHDIT_HOST_ID) reads itself."""
    for hosts, readers in ((["a", "b"], [0, 1]), (["a", "a"], [0, 0])):
        results = run_ranks(2, jobs.readers_per_host, flux_folder, hosts)
        assert [reader for reader, _ in results] == readers, f"hosts {hosts}"
        assert all(differing == [] for _, differing in results), f"hosts {hosts}: {results}"


def test_fp8_layers_made_while_loading(run_ranks, flux_folder):
    """--fp8-gemm with a memory-efficient load: each Linear of the block lists turns FP8 as its weights
    arrive (no rank holds the unquantized model), and the images equal quantizing after a plain load."""
    pipefusion = dict(pipefusion_parallel_degree=2, warmup_steps=jobs.STEPS)
    for degrees in (dict(ulysses_degree=2), pipefusion):
        for rank, (fp8_layers, linears, diff) in enumerate(run_ranks(2, jobs.fp8_while_loading, flux_folder, degrees)):
            assert fp8_layers > 0 and linears == 0, f"{degrees} rank {rank}: {fp8_layers} FP8, {linears} Linear"
            assert diff == 0.0, f"{degrees} rank {rank}: {diff}"
