"""Patch-parallel VAE decode on N ranks equals the single-process decode (fp32, exact method).

Tolerance: max|parallel - serial| <= 1e-5 * max|serial|. The split changes only
the order of float32 sums (GroupNorm statistics, reduced across ranks in
float64) and the conv border rows (recomputed on a 3-row strip), so differences
are a few ulps; 1e-5 relative leaves margin for that and nothing else.
"""
import pytest
import torch
import torch.distributed as dist

from meshdit.distributed.comm import comm_stats
from meshdit.errors import ConfigError
from meshdit.vae import VaeDecodeSettings, decode, peak_memory_report
from meshdit.vae.patch_parallel import BandHooks, BandPlan

from .tiny_vaes import build_vae, latents_for, subgroup

KINDS = ["AutoencoderKL", "AutoencoderKLFlux2"]
# (batch, latent h, latent w): 7 rows divide by none of 2, 3, 4; 12 by all; 3 < 4 ranks (whole-latent fallback).
SHAPES = [(2, 7, 6), (1, 12, 5), (1, 3, 4)]
RTOL = 1e-5


# One 4-rank pool serves every group size (starting a pool costs ~10 s per rank here, mostly
# importing diffusers): groups of 2 and 3 are sub-groups with non-contiguous / offset ranks,
# which also checks that group ranks, not global ranks, pick the neighbours.
GROUPS = {2: [1, 3], 3: [1, 2, 3], 4: [0, 1, 2, 3]}


def _parallel_decodes(kind, shapes, ranks):
    group = subgroup(ranks)
    if dist.get_rank() not in ranks:
        return None
    vae = build_vae(kind)
    out = []
    for b, h, w in shapes:
        comm_stats.reset()
        image = decode(vae, latents_for(kind, b, h, w), VaeDecodeSettings(parallel=True), group)
        out.append((image, dict(comm_stats.bytes_sent), peak_memory_report()))
    # the hooks are gone afterwards: the VAE is as we found it
    assert not any(m._forward_hooks or m._forward_pre_hooks or "forward" in m.__dict__ for m in vae.modules())
    return out


@pytest.fixture(scope="module")
def serial():
    refs = {}
    for kind in KINDS:
        vae = build_vae(kind)
        refs[kind] = [decode(vae, latents_for(kind, b, h, w)) for b, h, w in SHAPES]
    return refs


@pytest.mark.parametrize("world", [2, 3, 4])
@pytest.mark.parametrize("kind", KINDS)
def test_parallel_equals_serial(run_ranks, serial, kind, world):
    per_rank = run_ranks(4, _parallel_decodes, kind, SHAPES, GROUPS[world], timeout=120)
    per_rank = [per_rank[r] for r in GROUPS[world]]
    for s, (b, h, w) in enumerate(SHAPES):
        ref = serial[kind][s]
        assert ref.shape == (b, 3, 4 * h, 4 * w)
        for rank, results in enumerate(per_rank):
            image, sent, report = results[s]
            torch.testing.assert_close(image, ref, rtol=0, atol=RTOL * ref.abs().max().item(),
                                       msg=lambda m: f"{kind} {world} ranks, shape {(b, h, w)}, rank {rank}: {m}")
            if h >= world:   # really split: halos and GroupNorm statistics travelled
                assert sent["vae_halo_p2p"] > 0 and sent["vae_groupnorm_all_reduce"] > 0
                assert report["mode"] == "parallel" and report["ranks"] == world
            else:            # fewer latent rows than ranks: each rank decodes the whole latent
                assert "vae_halo_p2p" not in sent


def _mismatched_shapes():
    vae = build_vae("AutoencoderKL")
    h = 8 + dist.get_rank()   # rank 1 has a different latent: must fail everywhere, not hang
    try:
        decode(vae, latents_for("AutoencoderKL", 1, h, 6), VaeDecodeSettings(parallel=True), dist.group.WORLD)
    except ConfigError as e:
        return str(e)
    return None


def _mismatched_values():
    vae = build_vae("AutoencoderKL")
    seed = 2 if dist.get_rank() == 2 else 1   # same shape, other values (another replica's image)
    try:
        decode(vae, latents_for("AutoencoderKL", 1, 8, 6, seed=seed), VaeDecodeSettings(parallel=True),
               dist.group.WORLD)
    except ConfigError as e:
        return str(e)
    return None


def test_ranks_that_disagree_fail_with_a_clear_error(run_ranks):
    messages = run_ranks(4, _mismatched_shapes, timeout=60)
    assert all(m is not None and "group ranks [1, 2, 3]" in m and "same latents" in m for m in messages)
    messages = run_ranks(4, _mismatched_values, timeout=60)
    assert all(m is not None and "group ranks [2]" in m and "same latents" in m for m in messages)


def test_unsupported_decoder_module_is_refused():
    vae = build_vae("AutoencoderKL")
    plan = BandPlan(group=None, rank=0, sizes=[4, 4], latent_height=8)
    vae.decoder.up_blocks[0].upsamplers[0].conv.stride = (2, 2)
    with pytest.raises(ConfigError, match="stride-1.*without --use-parallel-vae"):
        BandHooks(vae.decoder, plan)
    vae = build_vae("AutoencoderKL")
    vae.decoder.conv_act = torch.nn.Softmax(dim=2)   # mixes rows: cannot be split
    with pytest.raises(ConfigError, match="Softmax.*without --use-parallel-vae"):
        BandHooks(vae.decoder, plan)


def _builtin_tiling_is_restored():
    vae = build_vae("AutoencoderKL")
    vae.enable_tiling()
    decode(vae, latents_for("AutoencoderKL", 1, 6, 6), VaeDecodeSettings(parallel=True), dist.group.WORLD)
    return vae.use_tiling


def test_diffusers_tiling_flag_is_left_as_found(run_ranks):
    assert run_ranks(4, _builtin_tiling_is_restored, timeout=60) == [True] * 4


def _bf16_parallel_and_serial():
    vae = build_vae("AutoencoderKLFlux2").to(torch.bfloat16)
    z = latents_for("AutoencoderKLFlux2", 1, 7, 6).to(torch.bfloat16)
    return decode(vae, z, VaeDecodeSettings(parallel=True), dist.group.WORLD), decode(vae, z)


def test_bf16_parallel_is_within_bf16_rounding(run_ranks):
    # 16-bit decodes (the GPU case) cannot be bit-exact: sums run in another order. The bound,
    # 2 bf16 epsilons (2 * 2**-7) of max|serial|, is a few roundings; measured 3.6e-3.
    for parallel, serial_image in run_ranks(4, _bf16_parallel_and_serial, timeout=120):
        assert parallel.dtype == torch.bfloat16
        err = (parallel.float() - serial_image.float()).abs().max() / serial_image.float().abs().max()
        assert err <= 2 * 2**-7, err.item()
