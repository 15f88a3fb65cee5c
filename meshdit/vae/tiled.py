"""Tiled VAE decode: overlapping latent tiles decoded one at a time, cross-faded. Approximate.

Layout along each axis: the fewest tiles of the set size whose neighbours share
at least the set overlap, spread evenly (every tile full size; actual overlaps
are the set overlap or a little more). Each tile's weight ramps linearly across
each overlap it has with a neighbour, (i + 0.5) / n up on one side and the
mirror image down on the other, so two overlapping tiles sum to 1 there: a
linear cross-fade. The image is sum(w * tile) / sum(w), which also stays a
convex blend where three tiles meet (tiles much smaller than twice the overlap).

With a process group the tiles are shared out round robin; each rank adds its
weighted tiles into an image-sized buffer and one all-reduce sums them, so
every rank ends with the whole image.
"""
from __future__ import annotations

import math

import torch

from ..distributed.comm import all_reduce, group_rank, group_size


def tile_starts(length: int, tile: int | None, overlap: int) -> list[int]:
    """Start of each tile along an axis of `length` (latent units); tiles are min(tile, length) long."""
    if tile is None or tile >= length:
        return [0]
    count = math.ceil((length - overlap) / (tile - overlap))
    return [round(k * (length - tile) / (count - 1)) for k in range(count)]


def axis_weights(starts: list[int], tile: int, scale: int) -> list[torch.Tensor]:
    """Per tile, its weight along this axis in pixels ([tile * scale]); ramps over each shared overlap."""
    weights = []
    for k, start in enumerate(starts):
        w = torch.ones(tile * scale, dtype=torch.float64)
        if k > 0:  # overlap with the previous tile: ramp up from this tile's first pixel
            n = (starts[k - 1] + tile - start) * scale
            w[:n] *= (torch.arange(n, dtype=torch.float64) + 0.5) / n
        if k < len(starts) - 1:  # overlap with the next tile: ramp down to this tile's last pixel
            n = (start + tile - starts[k + 1]) * scale
            w[tile * scale - n:] *= 1 - (torch.arange(n, dtype=torch.float64) + 0.5) / n
        weights.append(w)
    return weights


def tiled_decode(decode_tile, latents: torch.Tensor, scale: int, out_channels: int, tile_h: int | None,
                 tile_w: int | None, overlap: int, group=None) -> torch.Tensor:
    """decode_tile(latent tile) -> image tile; tile sizes and overlap in latent units (None: whole axis).

    NOTE: with a group, every rank of it must call this with the same latents (one all_reduce).
    """
    b, _, h, w = latents.shape
    th, tw = min(tile_h or h, h), min(tile_w or w, w)
    ys, xs = tile_starts(h, th, overlap), tile_starts(w, tw, overlap)
    wy, wx = axis_weights(ys, th, scale), axis_weights(xs, tw, scale)
    world, me = group_size(group), group_rank(group)
    tiles = [(i, j) for i in range(len(ys)) for j in range(len(xs))]
    image = None
    for k, (i, j) in enumerate(tiles):
        if k % world != me:
            continue
        y, x = ys[i], xs[j]
        out = decode_tile(latents[:, :, y:y + th, x:x + tw].contiguous())       # [B, 3, th*s, tw*s]
        if image is None:
            image = out.new_zeros(b, out.shape[1], h * scale, w * scale)
        weight = (wy[i][:, None] * wx[j][None, :]).to(out.dtype)                # [th*s, tw*s]
        image[:, :, y * scale:(y + th) * scale, x * scale:(x + tw) * scale].addcmul_(out, weight)
        del out
    if world > 1:
        if image is None:  # fewer tiles than ranks: this rank only contributes zeros
            image = latents.new_zeros(b, out_channels, h * scale, w * scale)
        # NOTE: every rank of the group joins this all_reduce.
        all_reduce(image, group, "vae_tiles_all_reduce")
    total_y = torch.zeros(h * scale, dtype=torch.float64)
    for i, y in enumerate(ys):
        total_y[y * scale:(y + th) * scale] += wy[i]
    total_x = torch.zeros(w * scale, dtype=torch.float64)
    for j, x in enumerate(xs):
        total_x[x * scale:(x + tw) * scale] += wx[j]
    return image.div_((total_y[:, None] * total_x[None, :]).to(image.dtype))

