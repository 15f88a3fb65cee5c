"""A missing, corrupt or other model's adapter file is refused before ranks start (from its header, no torch) or
when it loads, naming the file and tensor; a failed load leaves the pipeline as it was."""
import argparse

import numpy as np
import pytest

from meshdit.config import GenerateRequest
from meshdit.engine import Engine
from meshdit.engine_settings import EngineSettings
from meshdit.errors import ConfigError
from meshdit.lora_files import parse_lora_flag
from meshdit.prelaunch import check_before_launch
from meshdit.testing.tiny_lora import save_tiny_lora
from meshdit.testing.tiny_models import tiny_pipeline

REQUEST = dict(prompt="a cat", height=36, width=44, num_inference_steps=2, guidance_scale=1.0,
               extra={"max_sequence_length": 8})


@pytest.fixture(scope="module")
def files(tmp_path_factory, tiny_folder):
    folder = tmp_path_factory.mktemp("bad-loras")
    good = save_tiny_lora("flux", str(folder / "good.safetensors"), seed=1)
    other = save_tiny_lora("sd3", str(folder / "sd3.safetensors"), seed=1)  # another model's adapter
    data = open(good, "rb").read()
    (folder / "truncated.safetensors").write_bytes(data[:-16])
    (folder / "garbage.safetensors").write_bytes(b"\x10\x00\x00\x00\x00\x00\x00\x00not json at all!")
    return dict(model=tiny_folder("flux"), good=good, other=other, missing=str(folder / "missing.safetensors"),
                truncated=str(folder / "truncated.safetensors"), garbage=str(folder / "garbage.safetensors"))


def _prelaunch(model, path):
    check_before_launch(EngineSettings(model, loras=(("x", path),)),
                        GenerateRequest(**REQUEST, loras=((path, 1.0),)))


@pytest.mark.parametrize("case, words", [("missing", "no such file"), ("garbage", "corrupt safetensors header"),
                                         ("truncated", "truncated: tensor"),
                                         ("other", "transformer.transformer_blocks.0.attn.to_k.lora_A.weight")])
def test_refused_before_ranks_start(files, case, words):
    with pytest.raises(ConfigError) as caught:
        _prelaunch(files["model"], files[case])
    assert files[case] in str(caught.value) and words in str(caught.value)


def test_good_adapter_passes_the_check_and_flag_parses(files):
    _prelaunch(files["model"], files["good"])
    assert parse_lora_flag("a/b.safetensors:0.5") == ("a/b.safetensors", 0.5)
    assert parse_lora_flag("c:/x.safetensors") == ("c:/x.safetensors", 1.0)
    with pytest.raises(argparse.ArgumentTypeError, match="finite"):  # argparse prints meshdit's message
        parse_lora_flag("a.safetensors:nan")


def test_failed_load_leaves_the_pipeline_unchanged(files):
    pipe = tiny_pipeline("flux")
    pipe.set_progress_bar_config(disable=True)
    before = {n: p for n, p in pipe.transformer.named_parameters()}
    base = Engine(pipe).generate(GenerateRequest(**REQUEST)).images
    # the good adapter loads first, then the other model's is refused at load (the check an API user gets)
    with pytest.raises(ConfigError) as caught:
        Engine(pipe, loras={"good": files["good"], "other": files["other"]})
    assert files["other"] in str(caught.value) and "lora_A.weight" in str(caught.value)
    after = {n: p for n, p in pipe.transformer.named_parameters()}
    assert after.keys() == before.keys() and all(after[n] is before[n] for n in before)  # no LoRA layer left
    assert np.array_equal(Engine(pipe).generate(GenerateRequest(**REQUEST)).images, base)


def test_family_without_a_lora_loader_is_refused(files):
    with pytest.raises(ConfigError, match="no LoRA loader for PixArtSigmaPipeline"):
        Engine(tiny_pipeline("pixart-sigma"), loras={"good": files["good"]})


def test_unknown_adapter_and_mixed_batches_are_refused(files):
    engine = Engine(tiny_pipeline("flux"), loras={"good": files["good"]})
    with pytest.raises(ConfigError, match="'nope' is not loaded"):
        engine.generate(GenerateRequest(**REQUEST, loras=(("nope", 1.0),)))
    with pytest.raises(ConfigError, match="same LoRA adapters"):
        engine.generate_many([GenerateRequest(**REQUEST, loras=(("good", 1.0),)), GenerateRequest(**REQUEST)])


def test_families_without_a_loader_match_diffusers_and_are_refused_before_launch(tiny_folder, files):
    import diffusers

    from meshdit.lora_files import PIPELINES_WITHOUT_LORA_LOADER
    from meshdit.models.registry import FAMILIES

    for family in FAMILIES:
        for name in family.pipeline_classes:
            assert hasattr(getattr(diffusers, name), "load_lora_weights") == (name not in PIPELINES_WITHOUT_LORA_LOADER)
    with pytest.raises(ConfigError, match="no LoRA loader for PixArtSigmaPipeline"):
        _prelaunch(tiny_folder("pixart-sigma"), files["good"])


def test_tensor_parallelism_with_adapters_is_refused_before_ranks_start(files):
    """tp splits the base weights but not peft's adapters beside them (the run failed inside attention)."""
    from meshdit.config import ParallelConfig

    with pytest.raises(ConfigError, match="--lora with --tensor-parallel-degree"):
        check_before_launch(EngineSettings(files["model"], ParallelConfig(tensor_parallel_degree=2),
                                           loras=(("x", files["good"]),)),
                            GenerateRequest(**REQUEST, loras=((files["good"], 1.0),)))
