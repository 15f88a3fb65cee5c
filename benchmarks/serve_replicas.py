"""Open-loop load on one and two Ray Serve replicas of `meshdit serve --ray` (1-rank replicas, one thread each,
so two replicas can use both of a 2-core machine's cores), and the same load with one replica killed mid-way.

Arrivals are Poisson (exponential gaps, a fixed seed) at rates given as multiples of one replica's saturated
throughput, measured first; every request is a synchronous `POST /v1/images/generations` in its own thread.
Each request ends completed (200), refused (429), failed (another status) or lost (no answer: the client timed
out or the connection broke). Prints one row per replica count and rate: completed / s, p50 and p99 latency of
the completed, the 429 rate, failures and losses; then the two-replica saturated throughput over one replica's.

    python -m benchmarks.serve_replicas [--rates 0.5 1 2] [--seconds 60] [--kill]
"""
from __future__ import annotations

import argparse
import os
import signal
import tempfile
import threading
import time
from pathlib import Path

import numpy as np

PROMPT = "two red circles on a white background"
FLAGS = ["--height", "128", "--width", "128", "--steps", "8", "--max-queue", "8"]


def replica_pids() -> list[int]:
    """Serve replica processes (each one a 1-rank mesh here)."""
    out = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if (entry / "cmdline").read_bytes().startswith(b"ray::ServeReplica"):
                    out.append(int(entry.name))
            except OSError:
                pass
    return sorted(out)


def start(replicas: int, logs: Path):
    from meshdit.testing.serve_process import Server

    os.environ["OMP_NUM_THREADS"] = "1"
    return Server(logs, "--ray", "--replicas", str(replicas), *FLAGS).wait_ready(timeout=600)


def saturated(server, seconds: float, clients: int) -> float:
    """Completed images per second with `clients` threads each sending its next request when the last returns."""
    done, stop = [0], time.monotonic() + seconds

    def client(i: int) -> None:
        while time.monotonic() < stop:
            r = server.client.post("/v1/images/generations", json={"prompt": PROMPT, "seed": i}, timeout=600)
            if r.status_code == 200 and time.monotonic() < stop:
                done[0] += 1
            elif r.status_code == 429:
                time.sleep(float(r.headers.get("Retry-After", "1")))

    threads = [threading.Thread(target=client, args=(i,)) for i in range(clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return done[0] / seconds


def open_loop(server, rate: float, seconds: float, kill_at: float | None = None, seed: int = 0) -> dict:
    """Poisson arrivals at `rate` per second for `seconds`; kill_at: seconds in, SIGKILL one replica process."""
    import httpx

    rng = np.random.default_rng(seed)
    arrivals = np.cumsum(rng.exponential(1.0 / rate, size=int(rate * seconds * 3) + 10))
    arrivals = arrivals[arrivals < seconds]
    outcomes: list[tuple[str, float]] = []
    lock = threading.Lock()
    start = time.monotonic()

    def request(i: int) -> None:
        sent = time.monotonic()
        try:
            r = server.client.post("/v1/images/generations", json={"prompt": PROMPT, "seed": i}, timeout=600)
            kind = "completed" if r.status_code == 200 else "refused" if r.status_code == 429 else "failed"
        except httpx.HTTPError:
            kind = "lost"
        with lock:
            outcomes.append((kind, time.monotonic() - sent))

    threads, killed = [], None
    for i, at in enumerate(arrivals):
        if kill_at is not None and killed is None and at >= kill_at:
            killed = replica_pids()[0]
            os.kill(killed, signal.SIGKILL)
        time.sleep(max(0.0, start + at - time.monotonic()))
        threads.append(threading.Thread(target=request, args=(i,)))
        threads[-1].start()
    for t in threads:
        t.join()
    wall = time.monotonic() - start
    kinds = [k for k, _ in outcomes]
    latency = np.array([s for k, s in outcomes if k == "completed"])
    return {"rate": rate, "sent": len(outcomes), "completed_per_s": kinds.count("completed") / wall,
            "p50_s": float(np.percentile(latency, 50)) if len(latency) else float("nan"),
            "p99_s": float(np.percentile(latency, 99)) if len(latency) else float("nan"),
            "refused": kinds.count("refused"), "failed": kinds.count("failed"), "lost": kinds.count("lost"),
            "killed_replica": killed}


def row(replicas: int, r: dict) -> str:
    return (f"| {replicas} | {r['rate']:.2f}/s | {r['sent']} | {r['completed_per_s']:.2f} | {r['p50_s']:.1f} s | "
            f"{r['p99_s']:.1f} s | {100 * r['refused'] / max(r['sent'], 1):.0f}% | {r['failed']} | {r['lost']} |"
            + (" one replica killed |" if r["killed_replica"] else " |"))


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rates", type=float, nargs="+", default=[0.5, 1.0, 2.0],
                        help="arrival rates as multiples of one replica's saturated throughput")
    parser.add_argument("--seconds", type=float, default=60.0, help="length of each open-loop run")
    parser.add_argument("--kill", action="store_true", help="also run two replicas at rate 1 with one killed midway")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="meshdit-serve-replicas-") as logs:
        capacity = {}
        print("| replicas | arrivals | sent | completed/s | p50 | p99 | 429 | failed | lost | |")
        print("|---|---|---|---|---|---|---|---|---|---|")
        for replicas in (1, 2):
            server = start(replicas, Path(logs))
            try:
                capacity[replicas] = saturated(server, args.seconds, clients=4 * replicas)
                one = capacity[1]
                for multiple in args.rates:
                    print(row(replicas, open_loop(server, multiple * one * replicas, args.seconds)), flush=True)
                if replicas == 2 and args.kill:
                    print(row(replicas, open_loop(server, one * replicas, args.seconds, kill_at=args.seconds / 2)),
                          flush=True)
            finally:
                server.stop()
        print(f"saturated: 1 replica {capacity[1]:.2f} images/s, 2 replicas {capacity[2]:.2f} images/s: "
              f"{capacity[2] / capacity[1]:.2f}x")


if __name__ == "__main__":
    main()
