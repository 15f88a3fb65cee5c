"""Tensor parallelism: tp ranks equal one process (fp32), alone and with Ulysses, CFG and PipeFusion; its
all-reduce bytes equal docs/tensor-parallel.md's formula; no tp rank holds a whole block."""
import numpy as np
import pytest

from meshdit.testing.tiny_models import tiny_families
from tests.parallel import tensor_jobs

SIZE = (36, 44)  # 9 x 11 = 99 image tokens: divides by no degree
_REFERENCE: dict = {}


def reference(name, steps=2):
    if (name, steps) not in _REFERENCE:
        _REFERENCE[name, steps] = tensor_jobs.run(name, {}, *SIZE, steps=steps)
    return _REFERENCE[name, steps]


def assert_exact(results, ref, forward=True):
    ref_out, ref_image = ref[0], ref[1]
    for rank, result in enumerate(results):
        out, image = result[0], result[1]
        if forward:
            tol = 1e-5 * ref_out.abs().max().item()
            assert (out - ref_out).abs().max().item() <= tol, f"rank {rank}: transformer output differs"
        tol = 1e-5 * float(np.abs(ref_image).max())
        assert float(np.abs(image - ref_image).max()) <= tol, f"rank {rank}: image differs"


def assert_no_whole_block(results, ref, bound=0.55):
    for rank, result in enumerate(results):
        for i, (held, whole) in enumerate(zip(result[3], ref[3])):
            assert held <= bound * whole, f"rank {rank} block {i}: holds {held} of the block's {whole} bytes"


def tensor_parallel_builds(video: bool) -> list[tuple[str, float]]:
    """(build, the most of a block's bytes a tp rank may hold) of every family whose record sets parallel.tensor:
    its tiny module's TinyTests.tensor_parallel (None: its main build)."""
    builds = []
    for family, module in tiny_families(video=video):
        tests = module.TESTS
        if family.parallel.tensor:
            builds += [(name, tests.tensor_parallel_share) for name in
                       ((tests.main,) if tests.tensor_parallel is None else tests.tensor_parallel)]
    return builds


@pytest.mark.parametrize("name, share", [pytest.param(*b, id=b[0]) for b in tensor_parallel_builds(video=False)])
def test_tp2_equals_serial(run_ranks, name, share):
    """Every tensor-parallel image family (HunyuanDiT: its long skips' skip_linear stays whole, so the blocks that
    have one hold more than half; none is held whole)."""
    results = run_ranks(2, tensor_jobs.run, name, dict(tensor_parallel_degree=2), *SIZE)
    assert_exact(results, reference(name))
    assert_no_whole_block(results, reference(name), bound=share)


def test_uneven_heads(run_ranks):
    """6 heads over 4 ranks: heads [2, 2, 1, 1], the MLP split in the same proportion; exact."""
    results = run_ranks(4, tensor_jobs.run, "flux-6heads", dict(tensor_parallel_degree=4), *SIZE)
    assert_exact(results, reference("flux-6heads"))
    assert results[0][3][0] > results[3][3][0]  # rank 0 holds an extra head


@pytest.mark.parametrize("layout", [dict(ulysses_degree=2), dict(cfg_degree=2)], ids=["ulysses2", "cfg2"])
def test_tp2_combined(run_ranks, layout):
    results = run_ranks(4, tensor_jobs.run, "flux", dict(tensor_parallel_degree=2, **layout), *SIZE)
    assert_exact(results, reference("flux"))
    assert_no_whole_block(results, reference("flux"))


def test_tp2_pipefusion2_full_warmup(run_ranks):
    layout = dict(tensor_parallel_degree=2, pipefusion_parallel_degree=2, warmup_steps=2)
    results = run_ranks(4, tensor_jobs.run, "flux-4blocks", layout, *SIZE, forward=False)
    assert_exact(results, reference("flux-4blocks"), forward=False)


@pytest.mark.parametrize("layout", [{}, dict(ulysses_degree=2)], ids=["tp2", "tp2-ulysses2"])
def test_all_reduce_bytes_equal_the_formula(run_ranks, layout):
    """Per forward and rank: 2 all-reduces of [B, S, D] per double block, 1 per single block (its attention and
    MLP share proj_out), each counted 2 (T - 1) / T x its bytes; S = this rank's text + image tokens."""
    from meshdit.testing.tiny_models import tiny_pipeline

    tp = 2
    ulysses = layout.get("ulysses_degree", 1)
    results = run_ranks(tp * ulysses, tensor_jobs.run, "flux", dict(tensor_parallel_degree=tp, **layout), *SIZE)
    config = tiny_pipeline("flux").transformer.config
    dim = config.num_attention_heads * config.attention_head_dim
    batch, text, image = 1, 6, (SIZE[0] // 4) * (SIZE[1] // 4)
    for rank, result in enumerate(results):
        ulysses_rank = rank // tp  # tp is the innermost axis
        tokens = np.array_split(np.arange(text), ulysses)[ulysses_rank].size + \
            np.array_split(np.arange(image), ulysses)[ulysses_rank].size
        reduces = 2 * config.num_layers + config.num_single_layers
        formula = reduces * batch * tokens * dim * 4 * 2 * (tp - 1) / tp
        assert abs(result[2] - formula) <= 0.1 * formula, (rank, result[2], formula)


@pytest.mark.parametrize("name", [name for name, _ in tensor_parallel_builds(video=True)])
def test_tp2_video_equals_serial(run_ranks, name):
    """CogVideoX t2v and i2v (its TensorPlan, modulation gathered; i2v: learned positional embeddings), Wan t2v and
    i2v (Q/K norms across heads, all-reduced; Wan 2.2 TI2V's per-token modulation whole on every tp rank) at 9
    frames of 3 x 5 tokens."""
    from tests.models import video_jobs

    ref = video_jobs.generate(name, {}, fresh=True)
    results = run_ranks(2, video_jobs.generate, name, dict(tensor_parallel_degree=2), fresh=True)
    assert_exact(results, ref)


def test_tp2_with_fp8_gemm_is_closer_to_serial_fp8_than_fp8_is_to_full_precision(run_ranks):
    """--fp8-gemm under tp 2 quantizes the shards: a row-parallel shard's per-row scale covers its part of the
    inputs, so the image is not serial FP8's bit for bit; its distance to serial FP8 must stay below FP8's own
    distance to full precision."""
    name = "flux"
    exact = reference(name)[1]
    serial_fp8 = tensor_jobs.run(name, {}, *SIZE, forward=False, fp8_gemm=True)[1]
    results = run_ranks(2, tensor_jobs.run, name, dict(tensor_parallel_degree=2), *SIZE, forward=False, fp8_gemm=True)
    fp8_error = float(np.abs(serial_fp8 - exact).max())
    assert fp8_error > 0  # FP8 did run
    for rank, result in enumerate(results):
        assert float(np.abs(result[1] - serial_fp8).max()) < fp8_error, f"rank {rank}"
