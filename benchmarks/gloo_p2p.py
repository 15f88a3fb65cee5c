"""What gloo's point-to-point does in this torch: measured, for the rules in meshdit/distributed/comm.

Two CPU ranks. Rank 1 posts its receive DELAY seconds late; rank 0 times its send:
- send:   how long a blocking dist.send takes to return;
- isend:  how long dist.isend takes to return, whether its work is completed just
          before the peer's receive is posted, and when work.wait() returns;
for several message sizes. Then a cycle: both ranks call a blocking send to each
other before receiving (as a pipeline whose last stage hands back to the first).

    python -m benchmarks.gloo_p2p          # ~30 s; prints one line per case
"""
from __future__ import annotations

import datetime
import os
import sys
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

DELAY = 1.0
SIZES = [1, 1024, 256 * 1024, 16 * 1024 * 1024]  # float32 elements: 4 B .. 64 MiB


def _init(rank: int, port: int, timeout_s: float) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=2, timeout=datetime.timedelta(seconds=timeout_s))


def _late_receiver(rank: int, port: int, queue) -> None:
    _init(rank, port, 60)
    for numel in SIZES:
        for mode in ("send", "isend"):
            x = torch.ones(numel)
            dist.barrier()
            if rank == 1:
                time.sleep(DELAY)
                dist.recv(x, 0)
                continue
            start = time.perf_counter()
            if mode == "send":
                dist.send(x, 1)
                queue.put(f"send   {numel * 4:>9} B: returned after {time.perf_counter() - start:.3f} s "
                          f"(receive posted after {DELAY:.1f} s)")
            else:
                work = dist.isend(x, 1)
                returned = time.perf_counter() - start
                time.sleep(DELAY * 0.8)
                done_before = work.is_completed()
                work.wait()
                queue.put(f"isend  {numel * 4:>9} B: returned after {returned * 1e3:.2f} ms, completed before "
                          f"the receive: {done_before}, wait() returned after {time.perf_counter() - start:.3f} s")
    dist.barrier()
    dist.destroy_process_group()


def _blocking_cycle(rank: int, port: int, queue) -> None:
    _init(rank, port, 5)
    x = torch.ones(SIZES[0])
    start = time.perf_counter()
    try:
        dist.send(x, 1 - rank)  # both ranks send first, then receive
        dist.recv(x, 1 - rank)
        queue.put(f"cycle of blocking sends (rank {rank}): completed in {time.perf_counter() - start:.3f} s")
    except RuntimeError as exc:
        queue.put(f"cycle of blocking sends (rank {rank}): failed after {time.perf_counter() - start:.1f} s "
                  f"({' '.join(str(exc).split())[-90:]})")
    queue.close()
    queue.join_thread()  # the line reaches the parent before the hard exit
    os._exit(0)  # the group may be wedged: no teardown


def _run(fn, timeout: float) -> list[str]:
    from meshdit.distributed.ports import free_port

    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    port = free_port()
    procs = [ctx.Process(target=fn, args=(r, port, queue)) for r in range(2)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(timeout)
    lines = []
    while not queue.empty():
        lines.append(queue.get())
    for p in procs:
        if p.is_alive():
            p.kill()
            lines.append(f"rank process {procs.index(p)} still blocked after {timeout:.0f} s: killed")
    return lines


def main() -> None:
    print(f"torch {torch.__version__}, gloo, 2 CPU ranks", flush=True)
    for line in _run(_late_receiver, 120) + _run(_blocking_cycle, 20):
        print(line)
    sys.stdout.flush()


if __name__ == "__main__":
    main()
