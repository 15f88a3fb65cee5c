"""Per-rank activation memory of the VAE decode falls with the rank count; tiles bound it.

Measured by meshdit.vae.memory: live bytes of tensor storages created during
the decode (weights and inputs excluded), the figure peak_memory_report() gives.
"""
import torch
import torch.distributed as dist

from meshdit.vae import VaeDecodeSettings, decode, peak_memory_report, set_memory_method
from meshdit.vae.memory import track_peak_memory

from .tiny_vaes import build_vae, latents_for, subgroup

LATENT = 64   # 256 x 256 px with the tiny VAEs: big enough that the image-sized gather is a small share
GROUPS = {2: [0, 2], 4: [0, 1, 2, 3]}


def test_tracker_counts_live_tensors_exactly():
    x = torch.ones(1000, 1000)                  # 4 MB, allocated before: not counted
    with track_peak_memory(torch.device("cpu")) as report:
        a = x * 2                               # +4 MB
        b = a + 1                               # +4 MB
        a.mul_(3)                               # in place: nothing new
        v = b[10:]                              # a view: nothing new
        del a                                   # -4 MB
        c = b * v[:1]                           # +4 MB -> peak 8 MB
        del b, c, v
    assert report["peak_bytes"] == 8_000_000


def test_allocator_method_sees_at_least_the_tensors():
    vae, z = build_vae("AutoencoderKL"), latents_for("AutoencoderKL", 1, 16, 16)
    decode(vae, z)
    tensors = peak_memory_report()
    set_memory_method("allocator")
    try:
        decode(vae, z)
        allocator = peak_memory_report()
    finally:
        set_memory_method("tensors")
    assert "allocator" in allocator["method"] and "storages" in tensors["method"]
    assert tensors["peak_bytes"] <= allocator["peak_bytes"] <= 2 * tensors["peak_bytes"]


def _parallel_peak(kind, ranks):
    group = subgroup(ranks)
    if dist.get_rank() not in ranks:
        return None
    decode(build_vae(kind), latents_for(kind, 1, LATENT, LATENT), VaeDecodeSettings(parallel=True), group)
    return peak_memory_report()


def test_parallel_peak_falls_with_rank_count(run_ranks):
    kind = "AutoencoderKL"
    decode(build_vae(kind), latents_for(kind, 1, LATENT, LATENT))
    single = peak_memory_report()
    assert single["mode"] == "local" and single["peak_bytes"] > 10 * 2**20
    peaks = {1: single["peak_bytes"]}
    for world, ranks in GROUPS.items():
        reports = [r for r in run_ranks(4, _parallel_peak, kind, ranks, timeout=120) if r is not None]
        assert len(reports) == world and all(r["mode"] == "parallel" and r["ranks"] == world for r in reports)
        peaks[world] = max(r["peak_bytes"] for r in reports)
    assert peaks[4] < peaks[2] < peaks[1]
    assert peaks[2] <= 0.6 * peaks[1], peaks       # measured 0.50
    assert peaks[4] <= 0.35 * peaks[1], peaks      # measured 0.25


def test_tiles_bound_the_peak():
    kind = "AutoencoderKLFlux2"
    vae, z = build_vae(kind), latents_for(kind, 1, LATENT, LATENT)
    decode(vae, z)
    whole = peak_memory_report()["peak_bytes"]
    decode(vae, z, VaeDecodeSettings(tile_height=64, tile_width=64, tile_overlap=16))
    tiled = peak_memory_report()
    assert tiled["mode"] == "tiled" and tiled["image_shape"] == (1, 3, 256, 256)
    # one 64 px tile's activations plus the 256 px image being blended
    assert tiled["peak_bytes"] <= 0.35 * whole, (tiled["peak_bytes"], whole)
