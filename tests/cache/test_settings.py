"""Cache settings: flags built from the fields, presets, and every bad setting refused before ranks start."""
import pytest

from meshdit.cache import CacheSettings
from meshdit.config import GenerateRequest, ParallelConfig
from meshdit.errors import ConfigError
from meshdit.flags import FlagParser, add_request_flags, request_from_args
from meshdit.models.info import ModelInfo
from meshdit.testing.tiny_models import tiny_pipeline


def parse(*argv):
    parser = FlagParser()
    add_request_flags(parser)
    return request_from_args(parser.parse_args(list(argv)), ["a red cat"])


def test_flags_reach_the_request():
    r = parse("--cache", "dbcache", "--cache-threshold", "0.1", "--cache-fn", "2", "--cache-bn", "1",
              "--cache-warmup", "3", "--cache-max-cached", "2", "--cache-compute-steps", "5", "9", "--taylorseer")
    assert r.cache == CacheSettings("dbcache", 0.1, 2, 1, 3, 2, (5, 9), 1)
    assert parse().cache == CacheSettings() and not parse().cache.enabled
    assert parse("--use_fbcache").cache.method == "fbcache"
    assert parse("--taylorseer", "2", "--cache", "fbcache").cache.taylorseer == 2


def test_fast_preset_parses_and_resolves_to_its_documented_values():
    """docs/caching.md, "The default preset": fbcache, threshold 0.6, warmup 4, at most 3 cached steps in a row."""
    r = parse("--cache", "fast").cache
    assert r == CacheSettings("fast")
    assert r.resolved() == CacheSettings("fbcache", threshold=0.6, front_blocks=1, back_blocks=0, warmup=4,
                                         max_cached=3)
    assert parse("--cache", "fast", "--cache-warmup", "6").cache.resolved().warmup == 6  # set options win
    assert parse("--cache", "fast", "--taylorseer").cache.resolved().taylorseer == 1


def test_serve_takes_the_same_methods_and_presets():
    from typing import get_args

    from meshdit.cache_settings import CHOICES
    from meshdit.serve.schemas import CacheBody

    assert set(get_args(CacheBody.model_fields["method"].annotation)) == set(CHOICES)


def test_presets_fill_unset_options():
    r = CacheSettings("fbcache").resolved()
    assert (r.front_blocks, r.back_blocks) == (1, 0) and r.threshold is not None and r.warmup is not None
    assert CacheSettings("dbcache", threshold=0.3).resolved().threshold == 0.3


@pytest.mark.parametrize("argv,message", [
    (["--use_teacache"], "--use-teacache: meshdit has no TeaCache.*--cache fbcache"),
    (["--use_fbcache", "--cache", "dbcache"], "two caches"),
])
def test_xdit_spellings(argv, message):
    with pytest.raises(ConfigError, match=message):
        parse(*argv)


@pytest.mark.parametrize("settings,message", [
    (CacheSettings("dbcache", threshold=-0.1), "--cache-threshold must be a finite number >= 0"),
    (CacheSettings("dbcache", threshold=float("nan")), "--cache-threshold"),
    (CacheSettings("teacache"), "--cache 'teacache' is neither a cache method nor a preset"),
    (CacheSettings("fast", threshold=-1), "--cache-threshold must be a finite number >= 0"),
    (CacheSettings("fast", back_blocks=1), "--cache-bn 1 does not apply to --cache fast"),
    (CacheSettings("dbcache", warmup=-1), "--cache-warmup must be a whole number >= 0"),
    (CacheSettings("dbcache", front_blocks=0), "--cache-fn must be a whole number >= 1"),
    (CacheSettings("dbcache", back_blocks=-1), "--cache-bn must be a whole number >= 0"),
    (CacheSettings("dbcache", max_cached=0), "--cache-max-cached"),
    (CacheSettings("dbcache", taylorseer=3), "--taylorseer takes order 1 or 2"),
    (CacheSettings("dbcache", compute_steps=(-1,)), "--cache-compute-steps"),
    (CacheSettings("fbcache", front_blocks=2), "--cache-fn 2 does not apply to --cache fbcache"),
    (CacheSettings(threshold=0.1), "--cache-threshold set.* step caching, which is off"),
])
def test_bad_settings_refused_naming_the_flag(settings, message):
    with pytest.raises(ConfigError, match=message):
        GenerateRequest(cache=settings).validate()


def test_model_aware_checks_run_with_the_model_checks():
    info = ModelInfo.from_pipeline(tiny_pipeline("flux-4blocks"))  # 2 double + 2 single blocks
    ok = GenerateRequest(height=32, width=32, cache=CacheSettings("dbcache", front_blocks=2, back_blocks=1))
    info.check_request(ParallelConfig(), ok)
    with pytest.raises(ConfigError, match=r"--cache-fn 2 \+ --cache-bn 2 leave none of this transformer's 4 blocks"):
        info.check_request(ParallelConfig(), GenerateRequest(
            height=32, width=32, cache=CacheSettings("dbcache", front_blocks=2, back_blocks=2)))
    pipefusion = ParallelConfig(pipefusion_parallel_degree=2)
    with pytest.raises(ConfigError, match=r"--cache runs with PipeFusion only with full warmup.*--warmup-steps 4"):
        info.check_request(pipefusion, GenerateRequest(height=32, width=32, num_inference_steps=4,
                                                       cache=CacheSettings("fbcache")))
    info.check_request(pipefusion, GenerateRequest(height=32, width=32, num_inference_steps=4, warmup_steps=4,
                                                   cache=CacheSettings("fbcache")))


def test_requests_with_different_cache_settings_never_share_a_batch():
    from meshdit.engine import Engine

    pipe = tiny_pipeline("pixart-sigma-4blocks")
    pipe.set_progress_bar_config(disable=True)
    engine = Engine(pipe)
    try:
        with pytest.raises(ConfigError, match="share their step cache settings"):
            engine.generate_many([GenerateRequest(height=32, width=32, num_inference_steps=2),
                                  GenerateRequest(height=32, width=32, num_inference_steps=2,
                                                  cache=CacheSettings("fbcache"))])
    finally:
        engine.close()
