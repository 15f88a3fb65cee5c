"""Engine.update_weights: new weights without a restart equal a fresh engine loaded with them, bit for bit, on one
process, under tensor parallelism (each rank its shards; with FP8 GEMMs re-quantized) and PipeFusion (each stage its
blocks); a LoRA adapter's tensors alone change (the base stays)."""
import pytest

from meshdit.errors import ConfigError
from meshdit.testing.tiny_models import tiny_pipeline
from tests.rl import weights_jobs

_FOLDERS: dict = {}


def folders(tmp_path_factory, tiny_folder, name):
    """(a tiny model folder, the same model with another transformer's weights)."""
    if name not in _FOLDERS:
        after = tmp_path_factory.mktemp(f"{name}-after")
        pipe = tiny_pipeline(name)
        pipe.transformer.load_state_dict(tiny_pipeline(name, seed=1).transformer.state_dict())
        pipe.save_pretrained(after)
        _FOLDERS[name] = tiny_folder(name), str(after)
    return _FOLDERS[name]


CASES = {
    # id: (pipeline, degrees, how the weights are passed, FP8 GEMMs)
    "flux-serial": ("flux", {}, "dict", False),
    "sd35-serial": ("sd35", {}, "path", False),
    "wan-serial": ("wan", {}, "pairs", False),
    "flux-tp2": ("flux", dict(tensor_parallel_degree=2), "path", False),
    "flux-tp2-fp8": ("flux", dict(tensor_parallel_degree=2), "dict", True),
    "sd35-tp2": ("sd35", dict(tensor_parallel_degree=2), "pairs", False),
    "flux-pipefusion2": ("flux", dict(pipefusion_parallel_degree=2, warmup_steps=3), "pairs", False),
    "wan-pipefusion2": ("wan", dict(pipefusion_parallel_degree=2, warmup_steps=3), "path", False),
}


@pytest.mark.parametrize("case", CASES)
def test_updated_weights_generate_what_a_fresh_engine_with_them_does(run_ranks, tmp_path_factory, tiny_folder, case):
    name, degrees, source, fp8 = CASES[case]
    before, after = folders(tmp_path_factory, tiny_folder, name)
    world = 2 if degrees else 1
    results = (run_ranks(2, weights_jobs.updated_vs_fresh, name, before, after, degrees, source, fp8) if degrees
               else [weights_jobs.updated_vs_fresh(name, before, after, degrees, source, fp8)])
    assert len(results) == world
    for rank, (images_equal, log_probs_equal, changed, written) in enumerate(results):
        assert changed, f"rank {rank}: the new weights did not change the images (the test would prove nothing)"
        assert images_equal and log_probs_equal, f"rank {rank}: the updated engine differs from a fresh one"
        assert written > 0
    if "pipefusion" in case:  # each stage wrote only its own blocks' tensors (and the rest of the model)
        import os

        from safetensors import safe_open

        with safe_open(os.path.join(after, weights_jobs.WEIGHTS), "pt") as f:
            total = len(list(f.keys()))
        assert all(written < total for *_, written in results)


@pytest.mark.parametrize("degrees", [{}, dict(pipefusion_parallel_degree=2, warmup_steps=3)], ids=["serial", "pf2"])
def test_a_lora_update_changes_the_adapter_only(run_ranks, tiny_folder, tmp_path_factory, degrees):
    from meshdit.testing.tiny_lora import save_tiny_lora

    folder = tiny_folder("flux")
    loras = tmp_path_factory.mktemp("loras")
    first = save_tiny_lora("flux", str(loras / "first.safetensors"), seed=0)
    second = save_tiny_lora("flux", str(loras / "second.safetensors"), seed=1)
    results = (run_ranks(2, weights_jobs.lora_updated_vs_fresh, "flux", folder, first, second, degrees) if degrees
               else [weights_jobs.lora_updated_vs_fresh("flux", folder, first, second, degrees)])
    for rank, (adapted_equal, base_unchanged, changed) in enumerate(results):
        assert changed, f"rank {rank}: the second adapter did not change the images (the test would prove nothing)"
        assert adapted_equal, f"rank {rank}: the updated adapter differs from a fresh load of it"
        assert base_unchanged, f"rank {rank}: the base weights changed"


def test_update_weights_refuses_names_and_shapes_of_another_model(tmp_path_factory):
    import torch

    from meshdit.engine import Engine

    engine = Engine(tiny_pipeline("flux"))
    try:
        with pytest.raises(ConfigError, match="has no weight 'nope.weight'"):
            engine.update_weights({"nope.weight": torch.zeros(1)})
        with pytest.raises(ConfigError, match="has shape \\(3,\\)"):
            engine.update_weights({"proj_out.bias": torch.zeros(3)})
        with pytest.raises(ConfigError, match="no such adapter"):
            engine.update_weights({}, adapter="missing")
        with pytest.raises(ConfigError, match="is not a file"):
            engine.update_weights(str(tmp_path_factory.mktemp("empty")))
    finally:
        engine.close()
