"""A ConfigError in a Python API script run on every rank (torchrun) is reported once, without a traceback.

Every rank runs the script, so every rank meets the same bad argument (a wrong model path) and, left alone,
prints its own traceback. `agreed` runs a check on every rank and gathers the outcomes (a few bytes, once per
load), so each rank raises the same ConfigError, naming the ranks that failed where not all did; `meshdit.init`
installs `report_once`, which prints an uncaught ConfigError as one line on the output rank and nothing on the
others (their exception says the output rank reported it). Other exceptions keep Python's own report.
"""
from __future__ import annotations

import sys
from typing import Callable

from .errors import ConfigError


def agreed(check: Callable[[], None], mesh) -> None:
    """check() on every rank of `mesh`; raises one ConfigError on every rank if it raised on any."""
    try:
        check()
        mine = None
    except ConfigError as exc:
        mine = str(exc)
    if mesh is None or mesh.world_group is None:
        if mine is not None:
            raise ConfigError(mine)
        return
    import torch.distributed as dist

    outcomes = [None] * dist.get_world_size()
    dist.all_gather_object(outcomes, mine, group=mesh.world_group)
    failed = [rank for rank, message in enumerate(outcomes) if message is not None]
    if not failed:
        return
    message = outcomes[failed[0]]
    if len(failed) < len(outcomes):
        message += f" (on rank(s) {failed} of {len(outcomes)})"
    error = ConfigError(message)
    error.reported_by_output_rank = not mesh.is_output_rank
    error.agreed_group = mesh.world_group  # every rank of it raises this error
    raise error


def report_once(is_output_rank: bool) -> None:
    """An uncaught ConfigError: one line on the output rank ("meshdit: error: ..."), silence elsewhere."""
    previous = sys.excepthook

    def hook(kind, exc, tb):
        if not issubclass(kind, ConfigError):
            return previous(kind, exc, tb)
        if is_output_rank or not getattr(exc, "reported_by_output_rank", False):
            print(f"meshdit: error: {exc}", file=sys.stderr, flush=True)
        group = getattr(exc, "agreed_group", None)
        if group is not None:  # the others wait for the output rank's line: torchrun stops them all at the first exit
            import torch.distributed as dist

            dist.barrier(group=group)
        from .distributed.mesh import teardown_distributed

        teardown_distributed()  # gloo may abort at exit without it

    sys.excepthook = hook
