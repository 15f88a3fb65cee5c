"""Data parallelism: the batch's images split over the dp axis; every rank gets all images back.

Every rank draws the whole batch's noise from the seed, then keeps its share, so
image i starts from the same noise whatever the layout and the images equal a
one-process run of the same request. No hooks: the engine calls share() before
denoising and gather() after decoding.
"""
from __future__ import annotations

import torch

from ..distributed.comm import all_gather_uneven, split_sizes
from ..mesh_axes import MeshAxis


def share(recipe, state, mesh):
    """The state for this rank's images of the batch (split_sizes over the dp axis)."""
    if mesh.size(MeshAxis.DP) == 1:
        return state
    sizes = split_sizes(state.batch_size, mesh.size(MeshAxis.DP))
    start = sum(sizes[: mesh.local_rank(MeshAxis.DP)])
    return recipe.slice_batch(state, start, start + sizes[mesh.local_rank(MeshAxis.DP)])


def gather(image: torch.Tensor, batch_size: int, mesh) -> torch.Tensor:
    """Every rank's decoded share [N_dp, 3, H, W] -> all `batch_size` images [N, 3, H, W], in batch order.

    NOTE: all ranks of the dp axis join this gather.
    """
    sizes = split_sizes(batch_size, mesh.size(MeshAxis.DP))
    return all_gather_uneven(image, 0, sizes, mesh.group(MeshAxis.DP), "dp_all_gather")
