"""CFG parallelism: the guidance branches (conditional, unconditional) on the ranks of the cfg axis.

Each rank of a CFG group of two computes one branch's noise prediction; the two are
exchanged (one all-gather per step or patch), so both ranks apply the same guidance
to the same predictions as one process would (exact). No hooks: the denoising loops
ask which branches are theirs and exchange the predictions.
"""
from __future__ import annotations

import torch

from ..distributed.comm import all_gather, group_rank, group_size


def local_branches(state, cfg_group) -> tuple[list[str], list[str], int]:
    """(all guidance branches, the ones this rank computes, the CFG group size)."""
    branches = state.branch_names
    cfg_size = group_size(cfg_group)
    if cfg_size > 1 and len(branches) != cfg_size:
        raise RuntimeError(f"CFG parallel over {cfg_size} ranks needs {cfg_size} guidance branches, "
                           f"this generation has {branches}")
    local = [branches[group_rank(cfg_group)]] if cfg_size > 1 else branches
    return branches, local, cfg_size


def exchange_branches(pred: torch.Tensor, branches: list[str], group) -> dict:
    """{branch: its prediction}: each rank of the CFG group contributes its own branch's.

    NOTE: both ranks of the group join this all_gather.
    """
    return dict(zip(branches, all_gather(pred, group)))
