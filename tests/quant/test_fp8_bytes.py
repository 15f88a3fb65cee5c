"""--fp8-comm: bytes each rank sends, against the FP8 formula and against the same run in bfloat16.

The runs are in bfloat16 (the GPU working dtype), so exact payloads (Ulysses' K
without --fp8-comm-k) cost what they would on a GPU. Counted at the one
communication module, per kind of traffic the codec applies to; the exact
output gather of sequence parallelism is not part of it.
"""
import math

import pytest
import torch

from meshdit.distributed.comm import split_sizes
from meshdit.quant.settings import Fp8Config
from tests.quant import jobs

HEADS, HEAD_DIM, TXT = 4, 16, 6  # tiny flux
IMG = (jobs.SIZE[0] // 4) * (jobs.SIZE[1] // 4)  # tiny VAE /2, Flux packs 2x2: 9 x 11 = 99 tokens
SEQ = TXT + IMG
ATTENTION_LAYERS = 2  # one double block, one single block
SCALE = 2  # bytes of one bfloat16 scale per token
MAX_RATIO = 0.55


def ulysses_formula(rank: int, forwards: int, fp8_k: bool) -> int:
    """Per forward and layer: Q, K, V shards [H/2, S_me, D] go to the peer, the output [H/2, S_peer, D] comes back."""
    mine, peer = split_sizes(SEQ, 2)[rank], split_sizes(SEQ, 2)[1 - rank]
    half = HEADS // 2 * HEAD_DIM
    fp8 = lambda tokens: half * tokens + SCALE * tokens  # noqa: E731
    k = fp8(mine) if fp8_k else 2 * half * mine
    return forwards * ATTENTION_LAYERS * (2 * fp8(mine) + k + fp8(peer))


def ring_formula(rank: int, forwards: int) -> int:
    """Per forward and layer: this rank's K/V block [2, H, S_me, D] goes once around a ring of 2."""
    mine = split_sizes(SEQ, 2)[rank]
    return forwards * ATTENTION_LAYERS * (2 * HEADS * HEAD_DIM * mine + SCALE * mine)


def pipe_formula(rank: int, forwards: int, steps: int) -> int:
    """Stage 0 sends the residual streams [S, C] per forward; stage 1 hands the latents [IMG, 16] back per step.

    The latents' 16 channels per token share a scale over 4 tokens (64 values).
    """
    if rank == 0:
        return forwards * (HEADS * HEAD_DIM * SEQ + SCALE * SEQ)
    return (steps - 1) * (16 * IMG + SCALE * math.ceil(IMG / 4))


CASES = {
    "u2_k_fp8": (dict(ulysses_degree=2), "all_to_all", Fp8Config(comm=True, comm_k=True)),
    "u2_k_exact": (dict(ulysses_degree=2), "all_to_all", Fp8Config(comm=True)),
    "r2": (dict(ring_degree=2), "ring_p2p", Fp8Config(comm=True)),
    "pp2": (dict(pipefusion_parallel_degree=2, warmup_steps=jobs.STEPS), "pipe_p2p", Fp8Config(comm=True)),
}


@pytest.mark.parametrize("case", CASES)
def test_wire_bytes(run_ranks, case):
    degrees, kind, fp8 = CASES[case]
    results = run_ranks(2, jobs.run, "flux", degrees, fp8, dtype=torch.bfloat16)
    for rank, r in enumerate(results):
        sent, bf16 = r["sent"][kind], r["bf16"][kind]
        if case.startswith("u2"):
            formula = ulysses_formula(rank, r["forwards"], fp8.comm_k)
        elif case == "r2":
            formula = ring_formula(rank, r["forwards"])
        else:
            formula = pipe_formula(rank, r["forwards"], r["steps"])
        print(f"fp8-comm {case} rank {rank}: {sent / r['steps']:.0f} B/step, measured/formula "
              f"{sent / formula:.3f}, fp8/bf16 {sent / bf16:.3f}")
        assert abs(sent / formula - 1) <= 0.10
        if case != "u2_k_exact":
            assert sent <= MAX_RATIO * bf16
        else:  # K stays bfloat16: a quarter of the payload saves nothing
            assert MAX_RATIO * bf16 < sent <= 0.7 * bf16


def test_sdpa_run_sends_its_bf16_bytes(run_ranks):
    """Without --fp8-comm the counted bytes are the bfloat16 bytes: the baseline is the same run's."""
    for r in run_ranks(2, jobs.run, "flux", dict(ulysses_degree=2), None, dtype=torch.bfloat16):
        assert r["sent"]["all_to_all"] == r["bf16"]["all_to_all"] > 0
