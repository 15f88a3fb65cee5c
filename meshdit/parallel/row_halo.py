"""RowHalo: a module over a rows-split stream's grid, given its neighbours' rows (SANA's Mix-FFN 3x3 conv).

Under sequence parallelism a rank holds a band of whole token rows (Split.rows). A module whose output row i reads
input rows i - n .. i + n (a conv with padding n, and per-pixel work around it) would pad the band's edges with
zeros where the image has rows. The pre-hook adds the n rows above and below from the neighbouring SP ranks
(comm.exchange_with_neighbours: one message each way), the forward hook trims them off the output, so each band
equals its rows of the whole image (exact). The first and last band keep the module's own zero padding: those
are the image's edges.

Under PipeFusion the rows beyond a patch belong to other patches: the module's input over the whole image is kept
per layer and guidance branch (in PipeFusion's stale store, freed with the stale K/V), refreshed with the rows each
forward computes (gathered over the SP ranks), and a patch reads its neighbour rows from it as last computed:
this step's for earlier patches, the last step's for later ones. With full warmup nothing is kept (exact).
"""
from __future__ import annotations

import fnmatch
from dataclasses import dataclass

import torch

from ..distributed.comm import all_gather_uneven, exchange_with_neighbours
from .plan import RowHalo

KIND = "sequence_halo"
"""comm_stats kind of the halo rows (and, under PipeFusion, of the gathered rows)."""


def apply_row_halo(modules: dict, halo: RowHalo, state, prefix: str) -> list:
    """Hooks every module matching halo.module; returns the handles."""
    handles = []
    for name, module in modules.items():
        if fnmatch.fnmatchcase(name, halo.module):
            hooks = _HaloHooks(state, halo, prefix + name)
            handles.append(module.register_forward_pre_hook(hooks.extend))
            handles.append(module.register_forward_hook(hooks.trim))
    if not handles:
        raise RuntimeError(f"sequence-parallel plan's RowHalo names {halo.module!r}, which matches no module")
    return handles


@dataclass
class _HaloHooks:
    state: object  # parallel.sequence._SequenceState
    halo: RowHalo
    name: str
    added: tuple[int, int] = (0, 0)
    """Rows added above and below this rank's band in the running forward."""

    @torch.compiler.disable  # p2p inside
    def extend(self, _module, args):
        x = args[0]  # [B, C, rows of this rank, W]
        state, n = self.state, self.halo.rows
        lens = state.lens(self.halo.stream)  # rows per SP rank of this forward
        if min(lens) < n:
            raise RuntimeError(f"{self.name}: every SP rank needs {n} rows of {self.halo.stream!r}, got {lens} "
                               "(models/info.py should have refused this layout)")
        stale = state.stale_kv
        start, stop = self._window()
        if stale is not None and (stale.keep or stop - start < self._full()):  # PipeFusion keeps or reads rows
            extended, above, below = self._from_stale(x, lens)
        else:
            first, last = state.sp_rank == 0, state.sp_rank == state.sp_size - 1
            prev, nxt = exchange_with_neighbours(None if first else x[:, :, :n], None if last else x[:, :, -n:],
                                                 state.sp_group, KIND)
            extended = torch.cat([t for t in (prev, x, nxt) if t is not None], dim=-2)
            above, below = (0 if first else n), (0 if last else n)
        self.added = (above, below)
        return (extended, *args[1:])

    def trim(self, _module, _args, out):
        above, below = self.added
        self.added = (0, 0)
        return out[:, :, above:out.shape[-2] - below]

    def _full(self) -> int:
        return self.state.full_lens[self.halo.stream]

    def _window(self) -> tuple[int, int]:
        """The rows this forward computes (a PipeFusion patch, or the whole image)."""
        state = self.state
        return state.window(self.halo.stream) if state.patch is not None else (0, self._full())

    def _from_stale(self, x, lens):
        """PipeFusion: this rank's band with n rows either side, read from the whole image's input as last
        computed, after writing this forward's rows (gathered over the SP ranks) into it."""
        state, n, full = self.state, self.halo.rows, self._full()
        start, stop = self._window()
        fresh = all_gather_uneven(x, -2, lens, state.sp_group, KIND)  # [B, C, stop - start, W]
        key = ("halo", self.name, state.stale_kv.branch)
        held = state.stale_kv.buffers.get(key)
        if stop - start == full:
            held = fresh
        elif held is None:
            raise RuntimeError(f"{self.name}: a patch ran before any whole-image step kept its neighbour rows")
        else:
            held = held[0]
            held[:, :, start:stop] = fresh
        state.stale_kv.buffers[key] = (held,)
        r0 = start + sum(lens[:state.sp_rank])
        r1 = r0 + lens[state.sp_rank]
        a, b = max(r0 - n, 0), min(r1 + n, full)
        return held[:, :, a:b], r0 - a, b - r1
