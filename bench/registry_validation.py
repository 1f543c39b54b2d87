"""Benchmark: image validation vs `skopeo inspect`, side by side, against the local registry.

For open and token auth and for images of 5 and 60 layers (an index with amd64 + arm64 children), runs
in one process, one after the other:

- `validate (worker pool)`: `validate_image` with one `RegistryPool` kept for the whole run, as a worker
  keeps it (tag → manifest in one GET, platform child, config, then the anonymous probe);
- `validate (cold pool)`: the same with a new pool per validation (a worker's first validation when
  nothing warmed it: new connections, no cached token);
- `validate (first after warm-up)`: a new pool per validation, warmed first by `warm_pool` as
  `worker.py` does at start (connection and the push identity's pull token); only the validation is timed;
- `skopeo inspect`: `skopeo inspect --tls-verify=false docker://…` (its own process per call, resolves
  the amd64 child and reads the config; no anonymous probe), the operator's tool for the same question.

The three run interleaved, round by round, so a change in machine load hits them alike. Prints wall
p50/p95 per validation, the ratio to skopeo's p50, and the HTTP requests one validation sends to the
registry (`/v2/…`) and to the token endpoint, counted at the transport.
Run: .venv/bin/python bench/registry_validation.py [--n 30]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from clients import registry as registry_client  # noqa: E402
from clients.image_validator import validate_image  # noqa: E402
from clients.registry import RegistryPool, split_image_repository  # noqa: E402
from domain.validation import ExpectedImage  # noqa: E402
from sandbox.registry import start_registry  # noqa: E402
from tests.registry.imagepush import ImageSpec, Pusher, good_labels  # noqa: E402

REPO = "bench/marinskyrl"
EXPECTED = ExpectedImage(platform="linux/amd64", revision="a" * 40, harbor_commit="b" * 40, min_layers=3)


class CountingTransport(httpx.AsyncBaseTransport):
    def __init__(self) -> None:
        self.inner = httpx.AsyncHTTPTransport()
        self.paths: list[str] = []

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        self.paths.append(request.url.path)
        return await self.inner.handle_async_request(request)

    async def aclose(self) -> None:
        await self.inner.aclose()


async def _seed(handle, tag: str, layers: int) -> None:
    if handle.mode == "token":
        handle.set_public(REPO, True)
    pusher = Pusher(handle.url, handle.credentials)
    try:
        labels = good_labels("a" * 40, "b" * 40)
        await pusher.push_index(REPO, tag, [ImageSpec("linux/amd64", labels=labels, layers=layers, seed=f"{tag}1"),
                                            ImageSpec("linux/arm64", labels=labels, layers=layers, seed=f"{tag}2")])
    finally:
        await pusher.aclose()


async def _validate(handle, tag: str, pool: RegistryPool) -> float:
    t0 = time.perf_counter()
    report = await validate_image(image_repository=f"{handle.host}/{REPO}", tag=tag, expected=EXPECTED,
                                  credentials=handle.credentials, insecure_hosts=[handle.host], pool=pool)
    if not report.ok:
        raise SystemExit(f"validation unexpectedly failed: {report.failures()}")
    return time.perf_counter() - t0


def _skopeo_args(handle, tag: str) -> list[str]:
    args = ["skopeo", "inspect", "--tls-verify=false"]
    if handle.credentials:
        args += ["--creds", ":".join(handle.credentials)]
    return [*args, f"docker://{handle.host}/{REPO}:{tag}"]


def _skopeo(args: list[str]) -> float:
    t0 = time.perf_counter()
    subprocess.run(args, check=True, capture_output=True)
    return time.perf_counter() - t0


def _split(paths: list[str]) -> str:
    registry = sum(1 for p in paths if p.startswith("/v2/"))
    return f"{registry} + {len(paths) - registry} token"


async def _measure(handle, tag: str, n: int) -> dict[str, tuple[list[float], str]]:
    """Interleaved (skopeo, warm, cold) rounds, so a change in machine load hits all three alike."""
    args = _skopeo_args(handle, tag)
    warm_transport = CountingTransport()
    warm_pool = RegistryPool(transport=warm_transport)
    _skopeo(args)
    await _validate(handle, tag, warm_pool)  # warm-up: connections and the push identity's token
    times: dict[str, list[float]] = {"skopeo inspect": [], "validate (worker pool)": [], "validate (cold pool)": [],
                                     "validate (first after warm-up)": []}
    requests = {"skopeo inspect": "-"}
    try:
        for i in range(n):
            times["skopeo inspect"].append(_skopeo(args))
            warm_transport.paths.clear()
            times["validate (worker pool)"].append(await _validate(handle, tag, warm_pool))
            if i == 0:
                requests["validate (worker pool)"] = _split(warm_transport.paths)
            cold_transport = CountingTransport()
            cold = RegistryPool(transport=cold_transport)
            try:
                times["validate (cold pool)"].append(await _validate(handle, tag, cold))
            finally:
                await cold.aclose()
            if i == 0:
                requests["validate (cold pool)"] = _split(cold_transport.paths)
            warmed_transport = CountingTransport()
            warmed = RegistryPool(transport=warmed_transport)
            try:
                host, repo = split_image_repository(f"{handle.host}/{REPO}")
                await registry_client.warm_pool(warmed, host, repo, scheme="http", credentials=handle.credentials)
                warmed_transport.paths.clear()
                times["validate (first after warm-up)"].append(await _validate(handle, tag, warmed))
            finally:
                await warmed.aclose()
            if i == 0:
                requests["validate (first after warm-up)"] = _split(warmed_transport.paths)
    finally:
        await warm_pool.aclose()
    return {name: (t, requests[name]) for name, t in times.items()}


def _pct(values: list[float], q: int) -> float:
    return statistics.quantiles(values, n=100, method="inclusive")[q - 1] if len(values) > 1 else values[0]


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--n", type=int, default=30, help="validations per row (default 30)")
    parser.add_argument("--smoke", action="store_true", help="the smallest run that still prints every table, in seconds (tests/bench/test_bench_smoke.py)")
    args = parser.parse_args()
    if args.smoke:
        args.n = 2
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for mode in ("open", "token"):
            with start_registry(Path(tmp) / mode, mode) as handle:  # type: ignore[arg-type]
                for layers in (5, 60):
                    tag = f"l{layers}"
                    await _seed(handle, tag, layers)
                    measured = await _measure(handle, tag, args.n)
                    base = _pct(measured["skopeo inspect"][0], 50)
                    for name in ("validate (worker pool)", "validate (first after warm-up)", "validate (cold pool)",
                                 "skopeo inspect"):
                        times, req = measured[name]
                        rows.append((mode, layers, name, _pct(times, 50) * 1e3, _pct(times, 95) * 1e3,
                                     _pct(times, 50) / base, req))
    print("| auth | layers | tool | p50 ms | p95 ms | p50 / skopeo | requests per validation |")
    print("|---|---:|---|---:|---:|---:|---|")
    for mode, layers, name, p50, p95, ratio, req in rows:
        print(f"| {mode} | {layers} | {name} | {p50:.1f} | {p95:.1f} | {ratio:.2f}× | {req} |")


if __name__ == "__main__":
    asyncio.run(main())
