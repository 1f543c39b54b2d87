"""Benchmark: full image validations against the local registry (open and token modes).

Prints validations/sec and p50/p95 latency per mode. One validation = HEAD tag, GET index, GET child,
GET config, then an anonymous probe with a fresh client (token flow in token mode).
Run: .venv/bin/python bench/registry_validation.py [--n 50] [--concurrency 4]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from clients.image_validator import validate_image  # noqa: E402
from domain.validation import ExpectedImage  # noqa: E402
from sandbox.registry import start_registry  # noqa: E402
from tests.registry.imagepush import ImageSpec, Pusher, good_labels  # noqa: E402

REPO, TAG = "bench/marinskyrl", "v1-amd64"


async def _seed(handle) -> None:
    if handle.mode == "token":
        handle.set_public(REPO, True)
    pusher = Pusher(handle.url, handle.credentials)
    try:
        labels = good_labels("a" * 40, "b" * 40)
        await pusher.push_index(REPO, TAG, [ImageSpec("linux/amd64", labels=labels, layers=48, seed="b1"),
                                            ImageSpec("linux/arm64", labels=labels, layers=48, seed="b2")])
    finally:
        await pusher.aclose()


async def _run(handle, n: int, concurrency: int) -> tuple[float, list[float]]:
    expected = ExpectedImage(platform="linux/amd64", revision="a" * 40, harbor_commit="b" * 40)
    sem = asyncio.Semaphore(concurrency)
    latencies: list[float] = []

    async def one() -> None:
        async with sem:
            t0 = time.perf_counter()
            report = await validate_image(image_repository=f"{handle.host}/{REPO}", tag=TAG, expected=expected,
                                          credentials=handle.credentials, insecure_hosts=[handle.host])
            latencies.append(time.perf_counter() - t0)
            if not report.ok:
                raise SystemExit(f"validation unexpectedly failed: {report.failures()}")

    start = time.perf_counter()
    await asyncio.gather(*(one() for _ in range(n)))
    return time.perf_counter() - start, latencies


def _pct(values: list[float], q: float) -> float:
    return statistics.quantiles(values, n=100, method="inclusive")[int(q) - 1] if len(values) > 1 else values[0]


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--n", type=int, default=50)
    parser.add_argument("--concurrency", type=int, default=4)
    args = parser.parse_args()
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for mode in ("open", "token"):
            with start_registry(Path(tmp) / mode, mode) as handle:  # type: ignore[arg-type]
                await _seed(handle)
                await _run(handle, 3, 1)  # warm-up
                wall, lat = await _run(handle, args.n, args.concurrency)
                rows.append((mode, args.n, args.concurrency, args.n / wall, _pct(lat, 50) * 1e3, _pct(lat, 95) * 1e3))
    print(f"{'mode':<8}{'n':>6}{'conc':>6}{'valid/s':>10}{'p50 ms':>10}{'p95 ms':>10}")
    for mode, n, conc, rate, p50, p95 in rows:
        print(f"{mode:<8}{n:>6}{conc:>6}{rate:>10.1f}{p50:>10.1f}{p95:>10.1f}")


if __name__ == "__main__":
    asyncio.run(main())
