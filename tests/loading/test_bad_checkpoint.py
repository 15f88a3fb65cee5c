"""A bad checkpoint ends every rank promptly with an error naming the file and tensor, never a hang."""
import json
import os
import shutil
import time

import pytest

from tests.loading import jobs

WEIGHTS = os.path.join("transformer", "diffusion_pytorch_model.safetensors")


def _copy(flux_folder, tmp_path):
    folder = tmp_path / "model"
    shutil.copytree(flux_folder, folder)
    return str(folder)


def _truncate(folder):
    path = os.path.join(folder, WEIGHTS)
    os.truncate(path, os.path.getsize(path) - 1000)
    return path, "truncated"


def _corrupt_header(folder):
    path = os.path.join(folder, WEIGHTS)
    with open(path, "r+b") as f:
        f.seek(8)
        f.write(b"\xff\x00not json")
    return path, "corrupt safetensors header"


def _wrong_shape(folder):
    config_path = os.path.join(folder, "transformer", "config.json")
    with open(config_path) as f:
        config = json.load(f)
    config["joint_attention_dim"] = 48  # context_embedder.weight is [64, 32] on disk
    with open(config_path, "w") as f:
        json.dump(config, f)
    return os.path.join(folder, WEIGHTS), "'context_embedder.weight' has shape [64, 32], the model's config gives [64, 48]"


def _missing(folder):
    path = os.path.join(folder, WEIGHTS)
    os.remove(path)
    return os.path.join(folder, "transformer"), "no safetensors weights"


@pytest.mark.parametrize("transport", ["shared", "broadcast"])
@pytest.mark.parametrize("damage", [_truncate, _corrupt_header, _wrong_shape, _missing],
                         ids=["truncated", "corrupt", "shape", "missing"])
def test_every_rank_fails_naming_the_file(run_ranks, flux_folder, tmp_path, damage, transport):
    folder = _copy(flux_folder, tmp_path)
    path, words = damage(folder)
    run_ranks(2, jobs.warm, dict(ulysses_degree=2))
    start = time.monotonic()
    messages = run_ranks(2, jobs.load_error, folder, dict(ulysses_degree=2), transport)
    elapsed = time.monotonic() - start
    for rank, message in enumerate(messages):
        assert path in message and words in message, f"rank {rank}: {message!r}"
    assert elapsed < 30, f"took {elapsed:.1f} s"  # ~1 s when idle; margin for a loaded 2-core CI
