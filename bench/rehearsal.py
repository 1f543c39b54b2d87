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

``--before DIR`` compares with another checkout (e.g. ``git worktree add /tmp/before <commit>``) in the same
conditions: each of ``--n`` rounds runs that checkout's bench/rehearsal.py and then this one's, each
``--n 1`` in its own process (own registry, caches and imports), alternating (A/B/A/B), and prints one
table with both sides and the load average around each side's rounds.

    .venv/bin/python bench/rehearsal.py [--n 5] [--trees era-c,era-b,fixture] [--isolation auto|bwrap|proot]
                                        [--arches amd64,arm64] [--before DIR]
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
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
    ap.add_argument("--before", metavar="DIR", help="another checkout to compare with, round by round (A/B)")
    args = ap.parse_args()
    if args.smoke:
        args.n, args.trees = 1, "fixture"
    if args.before:
        return compare(args)
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
            cpu: dict[str, list[float]] = {}
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
                            started, cpu0 = time.monotonic(), _cpu()
                            rehearse(contract, [t], bundle, script, harbor, env, images=images(cache),
                                     isolation=args.isolation)
                            (cold if label == "cold" else warm).setdefault(t.key, []).append(
                                time.monotonic() - started)
                            if label == "warm":
                                cpu.setdefault(t.key, []).append(_cpu() - cpu0)
                        runs.setdefault(t.key, []).append(t.rehearsal.seconds)
                        status[t.key] = t.rehearsal.status
                        root = t.rehearsal.root or ""
                        userland[t.key] = (f"{t.architecture} (qemu)" if "under proot -q" in root else
                                           f"{t.architecture}" if f"(linux/{t.architecture}," in root else
                                           "host variant")
                        loads.append(os.getloadavg()[0])
                        load.setdefault(t.key, []).append(loads[-1])
            for key in runs:
                rows.append((tree, key, userland[key], status[key], cold[key], warm[key], runs[key], load[key],
                             cpu[key]))
    print(f"isolation: {backend}; probe: {probe:.2f} s; rounds: {args.n}; stand-in task image "
          f"({', '.join(platforms())}) layer {layer_bytes / 1e6:.1f} MB "
          f"gzip; load average during the runs {min(loads):.1f}-{max(loads):.1f}\n")
    print("| tree | target | userland | verdict | cold p50 (s) | warm p50 (s) | warm p95 (s) | warm max (s) "
          "| warm CPU p50 (s) | isolated run p50 (s) | load |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for tree, key, land, st, c, w, r, ld, u in rows:
        print(f"| {tree} | {key} | {land} | {st} | {statistics.median(c):.2f} | {statistics.median(w):.2f} "
              f"| {_p95(w):.2f} | {max(w):.2f} | {statistics.median(u):.2f} | {statistics.median(r):.2f} "
              f"| {min(ld):.1f}-{max(ld):.1f} |")
    return 0


def _cpu() -> float:
    """CPU seconds of this process and its waited-for children (proot, qemu, bash: every run of a rehearsal)."""
    own, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + kids.ru_utime + kids.ru_stime


def _p95(xs: list[float]) -> float:
    """Nearest-rank 95th percentile (the max below 20 samples)."""
    ordered = sorted(xs)
    return ordered[max(0, -(-95 * len(ordered) // 100) - 1)]


def _table(text: str) -> list[dict[str, str]]:
    """The rows of the Markdown table a bench/rehearsal.py printed, by column name (any of its versions)."""
    lines = [ln for ln in text.splitlines() if ln.startswith("| ")]
    if not lines:
        return []
    head = [c.strip() for c in lines[0].strip("|").split("|")]
    return [dict(zip(head, (c.strip() for c in ln.strip("|").split("|")), strict=False)) for ln in lines[1:]]


def _round(checkout: Path, args: argparse.Namespace) -> tuple[list[dict[str, str]], str]:
    """One ``--n 1`` round of ``checkout``'s own bench: its rows, and the load average before and after it."""
    before = os.getloadavg()[0]
    argv = [sys.executable, str(checkout / "bench" / "rehearsal.py"), "--n", "1", "--trees", args.trees,
            "--isolation", args.isolation, *(["--arches", args.arches] if args.arches else [])]
    p = subprocess.run(argv, cwd=checkout, capture_output=True, text=True, env={**os.environ, "PYTHONPATH": str(checkout)})
    rows = _table(p.stdout)
    if p.returncode != 0 or not rows:
        raise SystemExit(f"{checkout}/bench/rehearsal.py failed (exit {p.returncode}): {(p.stdout + p.stderr)[-2000:]}")
    return rows, f"{before:.1f}-{os.getloadavg()[0]:.1f}"


def compare(args: argparse.Namespace) -> int:
    """A/B with ``--before``: the rounds alternate between the two checkouts; one table, both sides."""
    sides = {"before": Path(args.before).resolve(), "after": Path(__file__).resolve().parents[1]}
    if not (sides["before"] / "bench" / "rehearsal.py").is_file():
        raise SystemExit(f"--before {args.before}: no bench/rehearsal.py there")
    got: dict[tuple[str, str, str], list[tuple[str, float, float, str]]] = {}
    loads: dict[str, list[str]] = {"before": [], "after": []}
    for _ in range(args.n):
        for side, checkout in sides.items():
            rows, load = _round(checkout, args)
            loads[side].append(load)
            for r in rows:
                got.setdefault((r["tree"], r["target"], side), []).append(
                    (r["verdict"], float(r["cold p50 (s)"]), float(r["warm p50 (s)"]), r.get("userland", ""),
                     r.get("warm CPU p50 (s)", ""), load))
    print(f"isolation: {args.isolation}; rounds: {args.n} per side, alternating before/after; before = "
          f"{sides['before']}; load average around each round: before {', '.join(loads['before'])}; "
          f"after {', '.join(loads['after'])}\n")
    print("| tree | target | side | userland | verdict | cold p50 (s) | warm p50 (s) | warm p95 (s) | warm max (s) "
          "| warm CPU p50 (s) | warm runs (s) @ load |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for (tree, key, side), rows in sorted(got.items(), key=lambda kv: (kv[0][0], kv[0][1], kv[0][2] != "before")):
        warm = [r[2] for r in rows]
        cpus = [float(r[4]) for r in rows if r[4]]
        print(f"| {tree} | {key} | {side} | {'/'.join(sorted({r[3] for r in rows})) or '-'} | "
              f"{'/'.join(sorted({r[0] for r in rows}))} | {statistics.median(r[1] for r in rows):.2f} | "
              f"{statistics.median(warm):.2f} | {_p95(warm):.2f} | {max(warm):.2f} | "
              f"{f'{statistics.median(cpus):.2f}' if cpus else '-'} | "
              f"{', '.join(f'{r[2]:.2f} @ {r[5]}' for r in rows)} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
