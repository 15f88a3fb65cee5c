"""Engine.generate_many (serving's batches) and on_step cancellation agreed by every rank.

A batch is not bit-equal to its requests run alone: CPU matmul and conv kernels sum in a
different order for a different batch size (measured: 1.2e-6 at most in [0, 1] images, the
transformer alone differs by 3.6e-7). The bound tested is BATCH_BOUND.
"""
import numpy as np
import pytest

BATCH_BOUND = 1e-5  # in [0, 1] image units: far below one PNG level (1/255 = 3.9e-3)

from tests.serve import engine_jobs


def test_batched_requests_equal_their_solo_images_in_one_process():
    solo, batch = engine_jobs.batched_and_solo({})
    assert [b.shape[0] for b in batch] == [1, 2, 1]
    for alone, together in zip(solo, batch):
        np.testing.assert_allclose(together, alone, rtol=0, atol=BATCH_BOUND)


def test_batched_requests_split_over_data_parallel_groups_equal_their_solo_images(run_ranks):
    for solo, batch in run_ranks(2, engine_jobs.batched_and_solo, dict(data_parallel_degree=2), (2, 2)):
        for alone, together in zip(solo, batch):
            np.testing.assert_allclose(together, alone, rtol=0, atol=BATCH_BOUND)


def test_a_stop_asked_by_one_rank_stops_every_rank_at_that_step_under_pipefusion(run_ranks):
    # PipeFusion is the hard case: stage 0 must take the patches the last stage sent ahead.
    # (Ulysses is covered by the server's cancellation test.)
    results = run_ranks(2, engine_jobs.cancel_on_one_rank, dict(pipefusion_parallel_degree=2, warmup_steps=1), 1, 2)
    for stopped, seen, after in results:
        assert stopped == 2 and seen == [0, 1, 2]
        assert after.shape == (1, 32, 32, 3)
    np.testing.assert_array_equal(results[0][2], results[1][2])


def test_requests_with_other_pipefusion_settings_never_share_a_batch():
    from meshdit.errors import ConfigError

    engine = engine_jobs.engine_for({})
    try:
        for other in (dict(warmup_steps=2), dict(num_pipeline_patch=3), dict(kv_drift_correction=False)):
            with pytest.raises(ConfigError, match="must share PipeFusion's"):
                engine.generate_many([engine_jobs.request(1), engine_jobs.request(2, **other)])
    finally:
        engine.close()


def test_requests_of_a_noise_drawing_scheduler_never_share_a_batch():
    """HunyuanDiT's DDPM step draws from each request's generator: a batch would hand the later requests the
    first one's generator (other images than alone), so the engine refuses it and the server never forms it."""
    import torch

    from meshdit.denoising.batching import concat_states
    from meshdit.errors import ConfigError
    from meshdit.models.info import ModelInfo
    from tests.parallel.sp_jobs import pipeline, request

    engine = engine_jobs.Engine(pipeline("hunyuandit"))
    try:
        assert engine.info.draws_noise_each_step
        requests = [request("hunyuandit", 32, 32, seed=s) for s in (1, 2)]
        with pytest.raises(ConfigError, match="cannot share a batch"):
            engine.generate_many(requests)
        states = [engine.recipe.prepare(r, torch.Generator().manual_seed(r.seed), torch.device("cpu"))
                  for r in requests]
        with pytest.raises(ValueError, match="step_kwargs|generator"):
            concat_states(engine.recipe, states)
    finally:
        engine.close()
    flux = ModelInfo.from_pipeline(pipeline("flux"))
    assert not flux.draws_noise_each_step  # flow matching: its requests do batch


@pytest.mark.parametrize("name, shared", [("flux", True), ("hunyuandit", False)])
def test_the_server_batches_requests_only_where_the_scheduler_draws_no_noise(name, shared):
    from meshdit.config import GenerateRequest
    from meshdit.engine_settings import EngineSettings
    from meshdit.serve.schemas import ImageRequest
    from meshdit.serve.server_state import ServerState, ServeSettings
    from tests.parallel.sp_jobs import pipeline

    defaults = GenerateRequest(prompt="-", height=32, width=32, num_inference_steps=2, guidance_scale=3.0)
    state = ServerState(ServeSettings(EngineSettings(name), defaults))
    engine = engine_jobs.Engine(pipeline(name))
    try:
        state.attach(engine)
        first, second = (state.make_job(ImageRequest(prompt="a red cat", size="32x32", seed=s)) for s in (1, 2))
    finally:
        engine.close()
    assert (first.batch_key == second.batch_key) is shared


def test_http_threads_checking_prompt_lengths_leave_the_pipelines_text_encoding_padded():
    """The server counts each request's tokens on HTTP threads while the rank loop encodes prompts: a fast
    tokenizer's padding is state that every call sets, so on a shared tokenizer some encodings came out
    unpadded (CI: a batch of 9- and 32-token embeddings that could not be joined). The counts use copies."""
    import threading

    from meshdit.config import GenerateRequest
    from meshdit.default_model import weights_path
    from meshdit.engine_settings import EngineSettings
    from meshdit.serve.schemas import ImageRequest
    from meshdit.serve.server_state import ServerState, ServeSettings

    defaults = GenerateRequest(prompt="-", height=64, width=64, num_inference_steps=2, guidance_scale=3.0,
                               extra={"max_sequence_length": 32})
    state = ServerState(ServeSettings(EngineSettings(str(weights_path())), defaults))
    engine = engine_jobs.Engine.from_pretrained()
    prompt, stop = "two red circles on a white background", threading.Event()

    def count_tokens() -> None:
        while not stop.is_set():
            state.make_job(ImageRequest(prompt=prompt, size="64x64"))

    try:
        state.attach(engine)
        threads = [threading.Thread(target=count_tokens) for _ in range(4)]
        for t in threads:
            t.start()
        tokenizer = engine.pipe.tokenizer_2
        lengths = {tokenizer([prompt, ""], padding="max_length", max_length=32, truncation=True,
                             return_tensors="pt").input_ids.shape[1] for _ in range(1500)}
    finally:
        stop.set()
        for t in threads:
            t.join()
        engine.close()
    assert lengths == {32}
