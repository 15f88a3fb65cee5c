"""Peak memory of the last VAE decode on this rank.

CPU: every tensor storage created while the decode runs is counted from its
allocation to its release (a TorchDispatchMode sees each op's outputs; a
weakref finalizer on the storage sees it freed). Peak = the highest sum of live
storages created during the decode, so weights, the input latents and anything
allocated before are excluded: it is the decode's activation memory, the figure
that grows with the image. Scratch memory an op allocates and frees inside
itself (e.g. a convolution's workspace) is not seen; see the benchmark for a
cross-check against the process's peak RSS.

set_memory_method("allocator") counts at the CPU allocator instead, scratch
included, through torch.profiler's memory events (slower, and kineto prints two
lines to stderr per decode, hence not the default; the benchmark uses both).

CUDA: torch.cuda.max_memory_allocated() over the decode, minus what was
allocated before it (same meaning: activation peak).
"""
from __future__ import annotations

import contextlib
import os

import torch

from ..memory import PeakAllocations

_last_report: dict = {}
_METHODS = ("tensors", "allocator")
_method = "tensors"


def set_memory_method(method: str) -> None:
    """"tensors" (default: live tensor storages) or "allocator" (CPU allocator events, scratch included)."""
    global _method
    if method not in _METHODS:
        raise ValueError(f"memory method must be one of {_METHODS}, got {method!r}")
    _method = method


def _allocator_peak(prof) -> int:
    """Highest running sum of the profiler's [memory] events (allocations +, frees -)."""
    events = sorted((e.start_ns(), e.nbytes()) for e in prof.profiler.kineto_results.events()
                    if e.name() == "[memory]")
    current = peak = 0
    for _, nbytes in events:
        current += nbytes
        peak = max(peak, current)
    return peak


def _rss_bytes() -> tuple[int, int]:
    """(current RSS, peak RSS since the last reset) from /proc; (0, 0) where unavailable."""
    try:
        with open("/proc/self/status") as f:
            fields = dict(line.split(":", 1) for line in f if ":" in line)
        return int(fields["VmRSS"].split()[0]) * 1024, int(fields["VmHWM"].split()[0]) * 1024
    except (OSError, KeyError, ValueError):
        return 0, 0


def _reset_rss_peak() -> bool:
    try:  # Linux: writing 5 resets VmHWM (peak RSS) to the current RSS
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


@contextlib.contextmanager
def track_peak_memory(device: torch.device, **details):
    """Measures the block's activation peak; the result becomes peak_memory_report()."""
    global _last_report
    report = dict(details)
    rss_ok = _reset_rss_peak()
    rss_before, _ = _rss_bytes()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        base = torch.cuda.memory_allocated(device)
        torch.cuda.reset_peak_memory_stats(device)
        yield report
        torch.cuda.synchronize(device)
        report.update(
            peak_bytes=torch.cuda.max_memory_allocated(device) - base,
            method="torch.cuda.max_memory_allocated() during the decode minus memory allocated before it",
        )
    elif _method == "allocator":
        from torch.profiler import ProfilerActivity, profile

        with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
            yield report
        report.update(
            peak_bytes=_allocator_peak(prof),
            method="peak of the running sum of CPU allocator events (torch.profiler profile_memory) during "
                   "the decode; includes op-internal scratch, excludes memory allocated before",
        )
    else:
        tracker = PeakAllocations()
        with tracker:
            yield report
        report.update(
            peak_bytes=tracker.peak_bytes,
            tensor_allocations=tracker.allocations,
            method="sum of live tensor storages created during the decode (TorchDispatchMode + weakref "
                   "finalizers); excludes weights, inputs and op-internal scratch",
        )
    if rss_ok:
        _, rss_peak = _rss_bytes()
        report["peak_rss_delta_bytes"] = max(0, rss_peak - rss_before)
    report["pid"] = os.getpid()
    _last_report = report


def peak_memory_report() -> dict:
    """What was measured for the last decode on this rank (empty before the first).

    Keys: peak_bytes (activation peak, see `method`), peak_mib, method, mode
    (local / parallel / tiled / parallel+tiled), ranks, rank, image and latent
    shapes, and peak_rss_delta_bytes (Linux: rise of the process's peak RSS over
    the decode; coarse, as the allocator keeps freed memory).
    """
    report = dict(_last_report)
    if "peak_bytes" in report:
        report["peak_mib"] = round(report["peak_bytes"] / 2**20, 2)
    return report
