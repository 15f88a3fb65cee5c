"""Ulysses, Ring and USP attention against full attention, on even and uneven shapes."""
import pytest
import torch
import torch.nn.functional as F

from meshdit.attention.kernels import attention_with_lse, merge_attention
from meshdit.attention.usp import usp_attention
from meshdit.config import ParallelConfig
from meshdit.distributed.comm import split_sizes
from meshdit.mesh_axes import MeshAxis
from meshdit.parallel.sequence import sequence_groups
from meshdit.testing.rank_pool import mesh_for


def _qkv(seq, heads, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(2, heads, seq, 16, generator=g) for _ in range(3)]


def test_merge_of_two_key_blocks_equals_full_attention():
    q, k, v = _qkv(37, 3)
    ref = F.scaled_dot_product_attention(q, k, v)
    o1, l1 = attention_with_lse(q, k[:, :, :20], v[:, :, :20])
    o2, l2 = attention_with_lse(q, k[:, :, 20:], v[:, :, 20:])
    out, _ = merge_attention(*merge_attention(None, None, o1, l1), o2, l2)
    torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-6)


def _usp_job(ring, ulysses, seq, heads):
    import torch.distributed as dist

    mesh = mesh_for(ParallelConfig(ring_degree=ring, ulysses_degree=ulysses))
    groups = sequence_groups(mesh)
    q, k, v = _qkv(seq, heads)
    lens = split_sizes(seq, ring * ulysses)
    me = dist.get_rank(mesh.group(MeshAxis.SP))
    start = sum(lens[:me])
    local = [t[:, :, start:start + lens[me]] for t in (q, k, v)]
    out = usp_attention(*local, groups, lens, None, lambda a, b, c, s: F.scaled_dot_product_attention(a, b, c, scale=s))
    ref = F.scaled_dot_product_attention(q, k, v)[:, :, start:start + lens[me]]
    return (out - ref).abs().max().item(), ref.abs().max().item()


@pytest.mark.parametrize(
    "ring,ulysses,seq,heads",
    [(1, 2, 64, 4), (2, 1, 64, 4), (1, 2, 37, 3), (2, 1, 37, 3), (2, 2, 53, 6), (1, 4, 53, 6), (4, 1, 11, 4), (2, 2, 9, 5)],
)
def test_usp_attention_equals_full_attention(run_ranks, ring, ulysses, seq, heads):
    for err, scale in run_ranks(ring * ulysses, _usp_job, ring, ulysses, seq, heads):
        assert err <= 1e-5 * scale


def _pipelined_job(ulysses, seq, heads, chunks):
    import torch.distributed as dist

    from meshdit.attention import usp

    mesh = mesh_for(ParallelConfig(ulysses_degree=ulysses))
    groups = sequence_groups(mesh)
    lens = split_sizes(seq, ulysses)
    me = dist.get_rank(mesh.group(MeshAxis.SP))
    local = [t[:, :, sum(lens[:me]):sum(lens[:me + 1])] for t in _qkv(seq, heads, seed=3)]
    kernel = lambda a, b, c, s: F.scaled_dot_product_attention(a, b, c, scale=s)  # noqa: E731
    layout = usp.UspLayout.of(groups, lens)  # reference: the head-major all-to-alls USP uses
    ref = usp.ulysses_out(kernel(*usp.ulysses_in(*local, groups, layout), None), groups, layout, heads)
    outs, pipelined, default = [], None, usp.ULYSSES_CHUNKS
    for n in (1, chunks):  # token-major, one all-to-all each way, then heads in `chunks` overlapped groups
        usp.ULYSSES_CHUNKS = n
        try:
            outs.append(usp_attention(*local, groups, lens, None, kernel))
            pipelined = usp._pipelines(*local, groups, usp.EXACT)
        finally:
            usp.ULYSSES_CHUNKS = default
    return all(torch.equal(out, ref) for out in outs), pipelined


@pytest.mark.parametrize("ulysses,seq,heads,chunks,pipelined",
                         [(2, 64, 4, 2, True), (2, 37, 5, 2, True), (2, 53, 6, 3, True), (4, 29, 9, 2, True),
                          (2, 37, 3, 2, False)])  # 3 heads on 2 ranks: one rank has 1 head, too few to chunk
def test_pipelined_ulysses_equals_one_all_to_all_bit_for_bit(run_ranks, ulysses, seq, heads, chunks, pipelined):
    """Heads sent in overlapped groups (uneven heads and tokens too) give the very same output."""
    for same, took_pipeline in run_ranks(ulysses, _pipelined_job, ulysses, seq, heads, chunks):
        assert same and took_pipeline == pipelined
