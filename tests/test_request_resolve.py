"""request.resolve_request, the one resolution of a request: `meshdit generate`'s flags and the Python API's
GenerateRequest resolve to the same ResolvedRequest (the same default prompt too); its refusals name the field
(RequestFieldError.field, which serve's 400 reports); batch_key groups only requests that may share a batch.
No ranks, no weights: config JSON only."""
from __future__ import annotations

import dataclasses

import pytest

from meshdit.cache_settings import CacheSettings
from meshdit.cli import build_parser, generate_settings
from meshdit.config import GenerateRequest, ParallelConfig
from meshdit.default_model import weights_path
from meshdit.errors import ConfigError, RequestFieldError
from meshdit.models.info import ModelInfo
from meshdit.request import ResolvedRequest, batch_key, batch_refusal, resolve_request

BUNDLED = str(weights_path())
# (generate's flags, the API's GenerateRequest fields) that ask for the same thing
SAME = [
    ([], {}),
    (["--prompt", "a cat", "--steps", "3", "--seed", "7"], dict(prompt="a cat", num_inference_steps=3, seed=7)),
    (["--prompt", "a", "b", "--size", "64x32", "--negative-prompt", "blur", "--max-sequence-length", "16"],
     dict(prompt=["a", "b"], width=64, height=32, negative_prompt="blur", extra={"max_sequence_length": 16})),
    (["--cache", "fbcache", "--warmup-steps", "2", "--guidance-scale", "1.5"],
     dict(cache=CacheSettings(method="fbcache"), warmup_steps=2, guidance_scale=1.5)),
]


@pytest.fixture(scope="module")
def info():
    return ModelInfo.from_pretrained(BUNDLED)


@pytest.mark.parametrize("flags, fields", SAME)
def test_the_cli_and_the_api_resolve_the_same_request(info, flags, fields):
    _, _, from_cli = generate_settings(build_parser().parse_args(["generate", *flags]))
    from_api = resolve_request(GenerateRequest(**fields), info, ParallelConfig())
    assert isinstance(from_cli, ResolvedRequest) and from_cli == from_api
    with pytest.raises(dataclasses.FrozenInstanceError):
        from_api.height = 64  # resolved once: nobody fills it again


def test_the_default_prompt_is_one(info):
    _, _, from_cli = generate_settings(build_parser().parse_args(["generate"]))
    assert from_cli.prompts == GenerateRequest().prompts == [resolve_request(GenerateRequest(), info).prompt[0]]


@pytest.mark.parametrize("fields, field", [
    (dict(height=100), "height"),  # not a multiple of the patch
    (dict(width=0), "width"),
    (dict(num_inference_steps=0), "num_inference_steps"),
    (dict(guidance_scale=float("nan")), "guidance_scale"),
    (dict(extra={"bogus": 1}), "extra"),
    (dict(cache=CacheSettings(method="fbcache", front_blocks=99)), "cache"),
    (dict(num_frames=9), "num_frames"),  # an image model
    (dict(num_pipeline_patch=0), "num_pipeline_patch"),
    (dict(prompt=[]), "prompt"),
])
def test_refusals_name_the_field(info, fields, field):
    with pytest.raises(RequestFieldError) as caught:
        resolve_request(GenerateRequest(**fields), info, ParallelConfig())
    assert caught.value.field == field


def test_layout_refusals_name_the_field(info):
    with pytest.raises(RequestFieldError) as caught:  # more data-parallel groups than images
        resolve_request(GenerateRequest(), info, ParallelConfig(data_parallel_degree=2))
    assert caught.value.field == "num_images_per_prompt"
    with pytest.raises(RequestFieldError) as caught:  # more patches than token rows
        resolve_request(GenerateRequest(height=64, num_pipeline_patch=64), info,
                        ParallelConfig(pipefusion_parallel_degree=2))
    assert caught.value.field == "num_pipeline_patch"
    with pytest.raises(ConfigError):  # the generic ConfigError still catches them
        resolve_request(GenerateRequest(width=-1), info)


def test_batch_key_groups_only_what_may_share_a_batch(info):
    config = ParallelConfig(pipefusion_parallel_degree=2)
    base = resolve_request(GenerateRequest(prompt="a", seed=1), info)
    same = resolve_request(GenerateRequest(prompt="b", seed=2, num_images_per_prompt=2), info)
    assert batch_key(base, info, config) == batch_key(same, info, config)
    for other in (dict(num_pipeline_patch=4), dict(cache=CacheSettings(method="fbcache")), dict(loras=(("x", 1.0),)),
                  dict(extra={"max_sequence_length": 16}), dict(height=64), dict(negative_prompt="blur")):
        changed = resolve_request(GenerateRequest(prompt="a", **other), info)
        assert batch_key(changed, info, config) != batch_key(base, info, config), other
        assert "must share" in batch_refusal([base, changed], info, config)
    assert batch_refusal([base, same], info, config) is None
