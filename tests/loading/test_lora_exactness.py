"""LoRA under every parallel method equals serial with the same adapter; serial equals diffusers' own
load_lora_weights + set_adapters bit for bit; switching adapters (and back to none) is exact."""
import numpy as np
import pytest
import torch

from meshdit.config import GenerateRequest
from meshdit.engine import Engine
from meshdit.testing.rank_pool import split_layout
from meshdit.testing.tiny_lora import save_tiny_lora
from meshdit.testing.tiny_models import tiny_pipeline
from tests.loading import lora_jobs

FAMILIES = ["flux-4blocks", "sd35-4blocks", "wan-4blocks"]
LAYOUTS = {"u2": dict(ulysses_degree=2), "r2": dict(ring_degree=2), "cfg2": dict(cfg_degree=2),
           "dp2": dict(data_parallel_degree=2),
           "pf2": dict(pipefusion_parallel_degree=2, warmup_steps=lora_jobs.STEPS, num_pipeline_patch=2)}
WEIGHTED = (("a", 0.8), ("b", 0.5))


@pytest.fixture(scope="module")
def adapters(tmp_path_factory):
    folder = tmp_path_factory.mktemp("loras")
    return {name: {a: save_tiny_lora(name, str(folder / f"{name}-{a}.safetensors"), seed=i + 1)
                   for i, a in enumerate("ab")} for name in FAMILIES}


_SERIAL: dict = {}


def serial(name, adapters, prompts):
    key = (name, tuple(prompts or ()))
    if key not in _SERIAL:
        _SERIAL[key] = lora_jobs.generate_with_loras(name, {}, adapters[name], [WEIGHTED], prompts)
    return _SERIAL[key]


@pytest.mark.parametrize("layout", list(LAYOUTS))
@pytest.mark.parametrize("name", FAMILIES)
def test_every_layout_equals_serial_with_adapters(run_ranks, adapters, name, layout):
    degrees = LAYOUTS[layout]
    prompts = ["a red cat", "a blue dog"] if layout == "dp2" else None
    (ref,), base_bytes = serial(name, adapters, prompts)
    results = run_ranks(split_layout(degrees)[0].world_size, lora_jobs.generate_with_loras, name, degrees,
                        adapters[name], [WEIGHTED], prompts)
    for rank, ((image,), held) in enumerate(results):
        assert np.abs(image - ref).max() <= 1e-5 * np.abs(ref).max(), f"rank {rank}"
        if layout == "pf2":  # each stage holds only its own blocks' adapter weights
            assert 0 < held < base_bytes, (held, base_bytes)
        else:
            assert held == base_bytes


PROMPT = "a red cat on a blue square"


def _video(name):
    return dict(num_frames=lora_jobs.FRAMES) if name.startswith("wan") else {}


def _request(name, loras=()):
    return GenerateRequest(prompt=PROMPT, height=64, width=48, num_inference_steps=2, guidance_scale=1.0,
                           loras=loras, extra={"max_sequence_length": 16}, **_video(name))


def _diffusers(name, adapters, weighted):
    pipe = tiny_pipeline(name)
    pipe.set_progress_bar_config(disable=True)
    for adapter, _ in weighted:
        pipe.load_lora_weights(adapters[name][adapter], adapter_name=adapter)
    pipe.set_adapters([a for a, _ in weighted], [w for _, w in weighted])
    kwargs = dict(guidance_scale=1.0, **_video(name)) if not name.startswith("flux") else {}
    out = pipe(prompt=PROMPT, height=64, width=48, num_inference_steps=2, max_sequence_length=16,
               generator=torch.Generator("cpu").manual_seed(0), output_type="np", **kwargs)
    return out.frames if name.startswith("wan") else out.images


@pytest.mark.parametrize("name", FAMILIES)
def test_serial_equals_diffusers_and_switching_is_exact(adapters, name):
    pipe = tiny_pipeline(name)
    pipe.set_progress_bar_config(disable=True)
    base = Engine(pipe).generate(_request(name)).images  # no adapter ever loaded
    pipe = tiny_pipeline(name)
    pipe.set_progress_bar_config(disable=True)
    engine = Engine(pipe, loras=adapters[name])
    weighted = engine.generate(_request(name, WEIGHTED)).images
    assert np.array_equal(weighted, _diffusers(name, adapters, WEIGHTED))  # bit for bit
    only_a = engine.generate(_request(name, (("a", 1.0),))).images
    by_path = engine.generate(_request(name, ((adapters[name]["b"], 1.0),))).images  # a file names its adapter too
    none = engine.generate(_request(name)).images
    assert np.array_equal(only_a, _diffusers(name, adapters, (("a", 1.0),)))
    assert np.array_equal(by_path, _diffusers(name, adapters, (("b", 1.0),)))
    assert np.array_equal(none, base)  # A -> B -> none: the base model's image
    assert not np.array_equal(only_a, base) and not np.array_equal(only_a, by_path)
