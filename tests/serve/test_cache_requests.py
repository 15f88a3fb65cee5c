"""Step caching per serve request: the body's `cache`, batches that never mix cache settings, the job's computed
vs cached steps, and the cached-step metric (ServerState and the queue, on a tiny model; no HTTP)."""
import pytest

from meshdit.config import GenerateRequest
from meshdit.engine import Engine
from meshdit.engine_settings import EngineSettings
from meshdit.serve.schemas import ImageRequest
from meshdit.serve.server_state import BadRequest, ServerState, ServeSettings
from meshdit.testing.tiny_models import tiny_pipeline

CACHE = {"method": "fbcache", "threshold": 0.55, "warmup": 1, "max_cached": 2}  # skips some of 6 steps here


@pytest.fixture(scope="module")
def served():
    pipe = tiny_pipeline("flux-4blocks")
    pipe.set_progress_bar_config(disable=True)
    engine = Engine(pipe)
    defaults = GenerateRequest(prompt="-", height=36, width=44, num_inference_steps=6,
                               extra={"max_sequence_length": 8})
    state = ServerState(ServeSettings(EngineSettings("tiny"), engine.resolve(defaults)))
    state.attach(engine)
    yield state, engine
    engine.close()


def test_cached_job_reports_computed_and_cached_steps_and_the_metric_counts_them(served):
    state, engine = served
    plain = state.make_job(ImageRequest(prompt="a red cat", seed=3))
    cached = state.make_job(ImageRequest(prompt="a red cat", seed=3, cache=CACHE))
    other = state.make_job(ImageRequest(prompt="a red cat", seed=3, cache=dict(CACHE, threshold=0.6)))
    same = state.make_job(ImageRequest(prompt="a blue dog", seed=4, cache=CACHE))
    assert len({plain.batch_key, cached.batch_key, other.batch_key}) == 3 and same.batch_key == cached.batch_key
    for job in (cached, plain, other, same):
        state.queue.submit(job)
    batches = []
    while len(state.queue):
        batches.append(state.queue.next_batch(0.1))
    assert [[j.id for j in b] for b in batches] == [[cached.id, same.id], [plain.id], [other.id]]
    for batch in batches:
        state.finish(batch, engine.generate_many([j.request for j in batch]))
    status = cached.public()
    assert status["computed_steps"] + status["cached_steps"] == 6
    assert 0 < status["cached_steps"] < 6, status
    assert "computed_steps" not in plain.public()
    metrics = state.metrics.render().decode()
    total = sum(j.cached_steps for j in (cached, other, same))
    assert f"meshdit_cached_steps_total {float(total)}" in metrics


@pytest.mark.parametrize("cache,message", [
    (dict(CACHE, threshold=-1), "--cache-threshold must be a finite number >= 0"),
    ({"method": "dbcache", "front_blocks": 2, "back_blocks": 2}, "leave none of this transformer's 4 blocks"),
    (dict(CACHE, front_blocks=2), "does not apply to --cache fbcache"),
])
def test_bad_cache_bodies_are_refused_naming_the_field(served, cache, message):
    state, _ = served
    with pytest.raises(BadRequest, match=message) as caught:
        state.make_job(ImageRequest(prompt="a red cat", cache=cache))
    assert caught.value.param == "cache"


def test_unknown_methods_and_fields_are_refused_by_the_schema():
    from pydantic import ValidationError

    for cache in ({"method": "teacache"}, {"method": "fbcache", "fn": 1}):
        with pytest.raises(ValidationError):
            ImageRequest(prompt="a", cache=cache)
