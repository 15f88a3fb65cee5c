"""CFG parallelism: the guidance branches (conditional, unconditional, and a family's further passes such as SD3's
skip-layer guidance) on the ranks of the cfg axis.

The rule: the state's branches, in their order, are dealt round-robin over the cfg ranks (branch j on rank
j mod d), fixed for the whole generation. A step runs the branches the recipe names for it (`Recipe.step_branches`:
SD3's skip-layer pass runs on some steps only); each rank computes its own of those and the predictions are
exchanged (one all-gather per step or patch), so every rank applies the same guidance to the same predictions as
one process would (exact). When a step leaves the ranks uneven (3 branches on 2 ranks; 2 branches on 3 ranks)
each rank sends as many slots as the busiest, zero-filled. No hooks: the loops ask which branches are theirs
and exchange the predictions.
"""
from __future__ import annotations

import torch

from ..distributed.comm import all_gather, group_rank, group_size

# the dtypes a prediction may have, by code (the first exchange of a generation agrees on one: a rank with
# no branch of its own at that step has no prediction to take it from)
_DTYPES = (torch.float32, torch.bfloat16, torch.float16, torch.float64)


def owner(branch_index: int, cfg_size: int) -> int:
    """The cfg rank that computes the state's branch number `branch_index` (round-robin)."""
    return branch_index % cfg_size


def local_branches(state, cfg_group) -> tuple[list[str], list[str], int]:
    """(all guidance branches, the ones this rank computes, the CFG group size)."""
    branches = state.branch_names
    cfg_size = group_size(cfg_group)
    if cfg_size > len(branches):
        raise RuntimeError(f"CFG parallel over {cfg_size} ranks needs at least {cfg_size} guidance branches, "
                           f"this generation has {branches}")
    me = group_rank(cfg_group)
    local = [b for j, b in enumerate(branches) if owner(j, cfg_size) == me]
    return branches, local, cfg_size


class BranchExchange:
    """One generation's exchange of predictions over the cfg group: every rank ends a step with every branch's."""

    def __init__(self, branches: list[str], group) -> None:
        self.branches, self.group = branches, group
        self.size = group_size(group)
        self.idle_dtype: torch.dtype | None = None  # what a rank with no branch of its own sends: agreed once

    def __call__(self, mine: dict[str, torch.Tensor], active: list[str], like: torch.Tensor) -> dict:
        """{branch: prediction} for every branch in `active` (this step's), given this rank's own (`mine`).
        like: a tensor of one prediction's shape and device (the latents). NOTE: every rank of the group joins."""
        if self.size == 1:
            return mine
        owned = [[b for j, b in enumerate(self.branches) if b in active and owner(j, self.size) == r]
                 for r in range(self.size)]
        slots = max(len(o) for o in owned)
        if self.idle_dtype is None and min(len(o) for o in owned) == 0:  # the same step on every rank
            self.idle_dtype = self._agree_dtype(mine, like.device)
        own = [mine[b] for b in owned[group_rank(self.group)]]
        dtype = own[0].dtype if own else self.idle_dtype
        own += [torch.zeros(like.shape, dtype=dtype, device=like.device)] * (slots - len(own))
        packed = torch.stack(own) if slots > 1 else own[0]  # [slots, *prediction] (one slot: the prediction)
        gathered = all_gather(packed, self.group)
        if slots == 1:
            return {o[0]: g for o, g in zip(owned, gathered) if o}
        return {b: g[s] for o, g in zip(owned, gathered) for s, b in enumerate(o)}

    def _agree_dtype(self, mine: dict[str, torch.Tensor], device) -> torch.dtype:
        """The predictions' dtype, from the ranks that have one (a 4-byte all-gather, once per generation)."""
        code = _DTYPES.index(next(iter(mine.values())).dtype) if mine else -1
        codes = {int(c) for c in all_gather(torch.tensor([code], device=device), self.group, "cfg_dtype") if int(c) >= 0}
        if len(codes) != 1:
            raise RuntimeError(f"the cfg ranks' predictions disagree in dtype: {[_DTYPES[c] for c in codes]}")
        return _DTYPES[codes.pop()]
