"""Which rank a failed run is blamed on, and the report the launcher raises.

When one rank dies (SIGKILL, the out-of-memory killer, a crash in C++) the others fail too, a moment
later, with a broken connection in their next collective; those errors usually reach the launcher
before it sees the death, so the first error to arrive is not the cause. The cause is chosen by
kind, then by time: a rank's own error (not a broken connection), else a rank that died without a
word (the launcher knows its signal or exit code), else the first broken connection. The other ranks'
errors are listed as consequences. No torch here: the launcher imports this.
"""
from __future__ import annotations

import re
import signal
from dataclasses import dataclass

# How a rank's collective fails once a peer has gone (gloo's TCP transport; NCCL's remote-exit report).
_BROKEN_CONNECTION = re.compile(
    r"gloo/transport|Connection (reset|closed|refused)|Broken pipe|remote process exited|"
    r"NCCL communicator was aborted|ProcessGroupNCCL.*(aborted|closed)", re.IGNORECASE)


@dataclass
class RankFailure:
    at: float          # time.time() of the error (a death: when the launcher saw it)
    line: str          # 'ValueError: first line', or for a death 'was killed by SIGKILL'
    traceback: str = ""
    died: bool = False  # ended without reporting: killed by a signal, or exited with a code

    @property
    def broken_connection(self) -> bool:
        return not self.died and bool(_BROKEN_CONNECTION.search(self.line + "\n" + self.traceback))

    def weight(self) -> tuple[int, float]:
        """Sort key of the cause: own errors first, then deaths, then broken connections; earliest first."""
        return (2 if self.broken_connection else 1 if self.died else 0), self.at


def death(at: float, exitcode: int) -> RankFailure:
    """A rank that ended without a word, from its exit code (negative: the signal that killed it)."""
    if exitcode < 0:
        try:
            name = signal.Signals(-exitcode).name
        except ValueError:
            name = f"signal {-exitcode}"
        hint = (" (sent from outside the run: kill -9, or the kernel's out-of-memory killer, see `dmesg`)"
                if exitcode == -signal.SIGKILL else "")
        return RankFailure(at, f"was killed by {name}{hint}", died=True)
    return RankFailure(at, f"exited with code {exitcode} without reporting an error", died=True)


def _short(text: str, limit: int = 110) -> str:
    return text if len(text) <= limit else text[:limit - 3] + "..."


def failure_report(failed: dict[int, RankFailure], done: set, world: int) -> str:
    """The cause with its traceback (if it raised); one line for every other rank."""
    cause = min(failed, key=lambda r: failed[r].weight())
    first = failed[cause]
    report = [f"rank {cause} {first.line}" if first.died else f"rank {cause} failed: {first.line}"]
    if first.traceback:
        report.append(first.traceback.rstrip())
    others = []
    for rank in range(world):
        if rank == cause:
            continue
        failure = failed.get(rank)
        if failure is None:
            others.append(f"rank {rank} {'had finished' if rank in done else 'was stopped'}")
        elif failure.broken_connection and not first.broken_connection:
            others.append(f"rank {rank} lost its connection to rank {cause} (a consequence: {_short(failure.line)})")
        elif failure.died:
            others.append(f"rank {rank} {_short(failure.line)}")
        else:
            others.append(f"rank {rank} failed after it: {_short(failure.line)}")
    if others:
        report.append("other ranks: " + "; ".join(others))
    return "\n".join(report)
