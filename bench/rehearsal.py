#!/usr/bin/env python3
"""Rehearsal time per target (target ≤ 5 s warm): the real era-B/era-C trees and the sandbox fixture.

Each round plans the tree in-process (contract → targets), builds its Iris bundle, and times
``rehearsal.runner.rehearse_targets`` for one target at a time (isolation probe, task image root,
bwrap run with the bundle unpacked at /app and the stand-ins, verdict), twice: with a cold image cache
(an empty cache directory: the task image's manifest and layers are fetched and unpacked) and warm
(the cache another rehearsal filled: one manifest HEAD, no layer download). The task image is the
sandbox's stand-in ubuntu:22.04 (sandbox/task_image.py) in a local docker-registry started here; an arm64
target on an amd64 worker runs in its arm64 variant through qemu user mode under proot (rehearsal/
emulation.py): the "userland" column says which, and each round runs the targets interleaved (amd64,
arm64, amd64, ...) so both see the same load, printed per row (1-minute load average, min-max).
Prints a Markdown table; asserts nothing; needs an isolation (else says so and exits 1).

    .venv/bin/python bench/rehearsal.py [--n 5] [--trees era-c,era-b,fixture] [--isolation auto|bwrap|proot]
                                        [--arches amd64,arm64]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from rehearsal import runner  # noqa: E402
from rehearsal.task_image import TaskImages  # noqa: E402
from sandbox.registry import start_registry  # noqa: E402
from sandbox.task_image import build_layer, mirrors_for, platforms, push_task_image  # noqa: E402
from tests.rehearsal.helpers import planned, rehearse  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=5)
    ap.add_argument("--trees", default="era-c,era-b,fixture")
    ap.add_argument("--smoke", action="store_true", help="the smallest run that still prints every table, in seconds (tests/bench/test_bench_smoke.py)")
    ap.add_argument("--isolation", default="auto", choices=["auto", "bwrap", "proot"],
                    help="policy.rehearsal_isolation (proot: as a worker under Pod Security baseline)")
    ap.add_argument("--arches", default="", help="only these target architectures (default: every planned one)")
    args = ap.parse_args()
    if args.smoke:
        args.n, args.trees = 1, "fixture"
    t0 = time.monotonic()
    backend, reason = runner.choose_isolation(args.isolation)
    probe = time.monotonic() - t0
    if reason:
        print(f"rehearsal skipped: {reason}")
        return 1
    rows: list[tuple[str, str, str, str, list[float], list[float], list[float], list[float]]] = []
    loads: list[float] = []
    with tempfile.TemporaryDirectory() as state, start_registry(Path(state) / "registry", "open") as registry:
        push_task_image(registry.host)
        layer_bytes = len(build_layer()[0])

        def images(cache: Path) -> TaskImages:
            return TaskImages(cache, mirrors=mirrors_for(registry.host), insecure_hosts=[registry.host])

        warm_cache = Path(state) / "warm"
        for tree in args.trees.split(","):
            cold: dict[str, list[float]] = {}
            warm: dict[str, list[float]] = {}
            runs: dict[str, list[float]] = {}
            status: dict[str, str] = {}
            userland: dict[str, str] = {}
            load: dict[str, list[float]] = {}
            for i in range(args.n):
                with tempfile.TemporaryDirectory() as tmp:
                    contract, targets, bundle, script, harbor = planned(
                        Path(tmp), tree, arches=args.arches.split(",") if args.arches else None)
                    for t in targets:
                        env = ({t.cluster: {"SANDBOX_UNAME_M": "aarch64"}}
                               if tree == "fixture" and t.architecture == "arm64" else None)
                        if not warm_cache.exists():
                            rehearse(contract, [t], bundle, script, harbor, env, images=images(warm_cache),
                                     isolation=args.isolation)
                        for label, cache in (("cold", Path(tmp) / f"cold-{t.key}-{i}"), ("warm", warm_cache)):
                            started = time.monotonic()
                            rehearse(contract, [t], bundle, script, harbor, env, images=images(cache),
                                     isolation=args.isolation)
                            (cold if label == "cold" else warm).setdefault(t.key, []).append(
                                time.monotonic() - started)
                        runs.setdefault(t.key, []).append(t.rehearsal.seconds)
                        status[t.key] = t.rehearsal.status
                        root = t.rehearsal.root or ""
                        userland[t.key] = (f"{t.architecture} (qemu)" if "under proot -q" in root else
                                           f"{t.architecture}" if f"(linux/{t.architecture}," in root else
                                           "host variant")
                        loads.append(os.getloadavg()[0])
                        load.setdefault(t.key, []).append(loads[-1])
            for key in runs:
                rows.append((tree, key, userland[key], status[key], cold[key], warm[key], runs[key], load[key]))
    print(f"isolation: {backend}; probe: {probe:.2f} s; rounds: {args.n}; stand-in task image "
          f"({', '.join(platforms())}) layer {layer_bytes / 1e6:.1f} MB "
          f"gzip; load average during the runs {min(loads):.1f}-{max(loads):.1f}\n")
    print("| tree | target | userland | verdict | cold p50 (s) | warm p50 (s) | warm p95 (s) | warm max (s) "
          "| isolated run p50 (s) | load |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for tree, key, land, st, c, w, r, ld in rows:
        print(f"| {tree} | {key} | {land} | {st} | {statistics.median(c):.2f} | {statistics.median(w):.2f} "
              f"| {_p95(w):.2f} | {max(w):.2f} | {statistics.median(r):.2f} | {min(ld):.1f}-{max(ld):.1f} |")
    return 0


def _p95(xs: list[float]) -> float:
    """Nearest-rank 95th percentile (the max below 20 samples)."""
    ordered = sorted(xs)
    return ordered[max(0, -(-95 * len(ordered) // 100) - 1)]


if __name__ == "__main__":
    sys.exit(main())
