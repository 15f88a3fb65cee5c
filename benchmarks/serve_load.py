"""Load on `meshdit serve`: N concurrent requests from T client threads against a 2-rank server
on the bundled model (256x256, 20 steps), with batching on and off.

Prints, per mode: lost, errors, 429s (each retried after Retry-After), throughput in
images/s, p50/p95 latency (first submission to image, retries included), and how far each
image is from the same seed's image run alone (PNG levels; batches are not bit-equal on CPU).

    python -m benchmarks.serve_load [--requests 32] [--threads 8] [--max-queue 8]
"""
from __future__ import annotations

import argparse
import base64
import io
import tempfile
import threading
import time
from pathlib import Path

import numpy as np

PROMPT = "two red circles on a white background"


def _png(b64: str) -> np.ndarray:
    from PIL import Image

    return np.asarray(Image.open(io.BytesIO(base64.b64decode(b64))).convert("RGB")).astype(int)


def run_mode(batching: bool, requests: int, threads: int, max_queue: int, seeds: int, logs: Path) -> dict:
    from meshdit.testing.serve_process import Server

    flags = ["--ulysses-degree", "2", "--max-queue", str(max_queue)] + ([] if batching else ["--no-batching"])
    server = Server(logs, *flags).wait_ready()
    latencies, images, errors, rejected = {}, {}, [], [0]
    try:
        def client(thread: int) -> None:
            for i in range(thread, requests, threads):
                start = time.perf_counter()
                while True:
                    r = server.client.post("/v1/images/generations", json={"prompt": PROMPT, "seed": i % seeds},
                                           timeout=900)
                    if r.status_code != 429:
                        break
                    rejected[0] += 1
                    time.sleep(float(r.headers["Retry-After"]))
                if r.status_code == 200:
                    latencies[i] = time.perf_counter() - start
                    images[i] = _png(r.json()["data"][0]["b64_json"])
                else:
                    errors.append(f"{r.status_code} {r.text[:200]}")

        start = time.perf_counter()
        workers = [threading.Thread(target=client, args=(t,)) for t in range(threads)]
        for w in workers:
            w.start()
        for w in workers:
            w.join()
        wall = time.perf_counter() - start
        solo = {}
        for seed in range(seeds):  # alone: nothing else is queued
            r = server.client.post("/v1/images/generations", json={"prompt": PROMPT, "seed": seed}, timeout=900)
            solo[seed] = _png(r.json()["data"][0]["b64_json"])
    finally:
        server.stop()
    diffs = [np.abs(image - solo[i % seeds]) for i, image in images.items()]
    lat = np.array(list(latencies.values()))
    return {"batching": batching, "lost": requests - len(images) - len(errors), "errors": len(errors),
            "rejected_429": rejected[0], "images_per_s": len(images) / wall,
            "p50_s": float(np.percentile(lat, 50)) if len(lat) else float("nan"),
            "p95_s": float(np.percentile(lat, 95)) if len(lat) else float("nan"),
            "max_png_levels_from_solo": int(max(d.max() for d in diffs)) if diffs else -1,
            "pixels_differing_from_solo": float(np.mean([(d > 0).mean() for d in diffs])) if diffs else 0.0,
            "error_texts": errors[:3]}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=32)
    parser.add_argument("--threads", type=int, default=8)
    parser.add_argument("--max-queue", type=int, default=4, help="small, so that some requests get 429")
    parser.add_argument("--seeds", type=int, default=8, help="distinct seeds (each also run alone to compare)")
    parser.add_argument("--modes", default="on,off", help="batching modes to run: on, off or on,off")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="meshdit-serve-load-") as logs:
        for mode in args.modes.split(","):
            r = run_mode(mode == "on", args.requests, args.threads, args.max_queue, args.seeds, Path(logs))
            print(f"batching {mode:3}: {args.requests} requests from {args.threads} threads: lost {r['lost']}, "
                  f"errors {r['errors']}, 429 answers {r['rejected_429']} (all retried), "
                  f"{r['images_per_s']:.2f} img/s, p50 {r['p50_s']:.1f} s, p95 {r['p95_s']:.1f} s; vs solo: "
                  f"max {r['max_png_levels_from_solo']} PNG level(s), {100 * r['pixels_differing_from_solo']:.3f}% "
                  f"of values differ", flush=True)
            for text in r["error_texts"]:
                print("   error:", text)


if __name__ == "__main__":
    main()
