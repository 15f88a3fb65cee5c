"""Engine.from_pretrained without a mesh runs where a diffusers user would `.to("cuda")`: a visible GPU, else the
CPU; an explicit device wins; the result says which (no GPU here: torch.cuda is faked at the seam)."""
import pytest
import torch

import meshdit.loading.entry as loading_entry
from meshdit.config import GenerateRequest, ParallelConfig
from meshdit.engine import Engine, engine_device
from meshdit.errors import ConfigError
from meshdit.testing.tiny_models import tiny_pipeline


@pytest.fixture
def visible_gpu(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)


def test_without_a_mesh_a_visible_gpu_is_chosen(visible_gpu):
    assert engine_device(None) == torch.device("cuda", 0)
    assert engine_device(None, "cpu") == torch.device("cpu")  # an explicit device wins
    assert engine_device(None, "cuda:1") == torch.device("cuda", 1)


def test_without_a_gpu_the_cpu_is_chosen(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert engine_device(None) == torch.device("cpu")


def test_a_mesh_decides_and_a_contrary_device_is_refused():
    from meshdit.distributed.mesh import SingleProcessMesh

    mesh = SingleProcessMesh(torch.device("cpu"), ParallelConfig())
    assert engine_device(mesh) == torch.device("cpu")
    with pytest.raises(ConfigError, match="differs from the mesh's cpu"):
        engine_device(mesh, "cuda:0")


def test_from_pretrained_loads_on_the_gpu_and_the_result_names_the_device(visible_gpu, monkeypatch, tiny_folder):
    asked = []

    def load(model, device, *args, **kwargs):  # the loading seam: where from_pretrained asks for the weights
        asked.append(device)
        return tiny_pipeline("flux")

    model = tiny_folder("flux")
    monkeypatch.setattr(loading_entry, "load_pipeline", load)
    engine = Engine.from_pretrained(model)
    Engine.from_pretrained(model, device="cpu").close()
    assert asked == [torch.device("cuda", 0), torch.device("cpu")]
    try:  # the tiny pipeline itself is on the CPU: the engine and its results say so
        result = engine.generate(GenerateRequest(prompt="a cat", height=32, width=32, num_inference_steps=1,
                                                 extra={"max_sequence_length": 6}))
        assert engine.device == torch.device("cpu") and result.device == "cpu"
    finally:
        engine.close()
