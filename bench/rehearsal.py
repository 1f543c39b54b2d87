#!/usr/bin/env python3
"""Rehearsal time per target (target ≤ 5 s): the real era-B/era-C trees and the sandbox fixture.

Each round plans the tree in-process (contract → targets), builds its Iris bundle, and times
``clients.rehearsal.run`` (bwrap root, bundle unpacked at /app, stand-ins, the planned command) plus the
verdict, per target. Prints a Markdown table (p50 / max per target over ``--n`` rounds) and the
one-off isolation probe. Asserts nothing; needs bwrap and user namespaces (else says so and exits 1).

    .venv/bin/python bench/rehearsal.py [--n 5] [--trees era-c,era-b,fixture]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from clients import rehearsal  # noqa: E402
from tests.rehearsal.helpers import planned, rehearse  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=5)
    ap.add_argument("--trees", default="era-c,era-b,fixture")
    args = ap.parse_args()
    t0 = time.monotonic()
    reason = rehearsal.isolation_unavailable()
    probe = time.monotonic() - t0
    if reason:
        print(f"rehearsal skipped: {reason}")
        return 1
    rows: list[tuple[str, str, str, list[float], list[float]]] = []
    for tree in args.trees.split(","):
        runs: dict[str, list[float]] = {}
        walls: dict[str, list[float]] = {}
        status: dict[str, str] = {}
        for _ in range(args.n):
            with tempfile.TemporaryDirectory() as tmp:
                contract, targets, bundle, script, harbor = planned(Path(tmp), tree)
                for t in targets:
                    started = time.monotonic()
                    rehearse(contract, [t], bundle, script, harbor,
                             cluster_env={t.cluster: {"SANDBOX_UNAME_M": "aarch64"}}
                             if tree == "fixture" and t.architecture == "arm64" else None)
                    walls.setdefault(t.key, []).append(time.monotonic() - started)
                    runs.setdefault(t.key, []).append(t.rehearsal.seconds)
                    status[t.key] = t.rehearsal.status
        for key in runs:
            rows.append((tree, key, status[key], runs[key], walls[key]))
    print(f"isolation probe (bwrap /bin/true): {probe:.2f} s; rounds: {args.n}\n")
    print("| tree | target | verdict | run p50 (s) | run max (s) | with probe + verdict p50 (s) |")
    print("|---|---|---|---|---|---|")
    for tree, key, st, r, w in rows:
        print(f"| {tree} | {key} | {st} | {statistics.median(r):.2f} | {max(r):.2f} | {statistics.median(w):.2f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
