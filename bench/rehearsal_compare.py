#!/usr/bin/env python3
"""What comparing every step costs per target (issue #26): the verdict and the build-context scan.

Runs each era-C target's rehearsal once (bwrap, as bench/rehearsal.py), then times, in-process and
``--n`` times each, (1) ``rehearsal.model.evaluate`` on its records (every kaniko and crane call, pins,
image reads, COPY sources against the context listing) and (2) ``rehearsal.runner.read_context`` on a
context of ``--mib`` MiB that the script wrote (the scan reads only what the script wrote; the bundle cap
is 25 MiB), for the target's credential placeholders in every encoding. Prints a Markdown table
(p50 / max in ms). Asserts nothing; needs bwrap (else says so and exits 1).

    .venv/bin/python bench/rehearsal_compare.py [--n 20] [--mib 25]
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

from domain.markers import variant_env  # noqa: E402
from rehearsal import runner  # noqa: E402
from rehearsal.model import (  # noqa: E402
    evaluate,
    expected_build_args,
    placeholder_forms,
    rehearsal_placeholders,
    rehearsal_plan,
)
from sandbox.task_image import local_task_images  # noqa: E402
from tests.rehearsal.helpers import TASK_IMAGE, planned  # noqa: E402


def _ms(xs: list[float]) -> str:
    return f"{statistics.median(xs) * 1000:.1f} | {max(xs) * 1000:.1f}"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=20)
    ap.add_argument("--mib", type=int, default=25)
    ap.add_argument("--smoke", action="store_true", help="the smallest run that still prints every table, in seconds (tests/bench/test_bench_smoke.py)")
    args = ap.parse_args()
    if args.smoke:
        args.n, args.mib = 1, 1
    reason = runner.isolation_unavailable()
    if reason:
        print(f"rehearsal skipped: {reason}")
        return 1
    rows = []
    with tempfile.TemporaryDirectory() as tmp, local_task_images(Path(tmp)) as images:
        image = images.root(TASK_IMAGE, "linux/amd64")
        contract, targets, bundle, script, harbor = planned(Path(tmp), "era-c")
        ctx = Path(tmp) / "ctx"
        for i in range(64):  # --mib MiB of script-written files, none holding a placeholder
            (ctx / f"d{i % 8}").mkdir(parents=True, exist_ok=True)
            (ctx / f"d{i % 8}" / f"f{i}").write_bytes(os.urandom(args.mib * 2**20 // 64))
        for t in targets:
            plan = rehearsal_plan(t, bundle_sha256=bundle.sha256, script_b64=None, cluster_env={})
            r = runner.run(plan, bundle.path, image)
            expected = expected_build_args(t, harbor_commit=harbor, build_commit=contract.commit,
                                           wheel_source_var=contract.script.wheel_source_var,
                                           megatron=variant_env(contract, t.variant))
            df = contract.dockerfiles[t.dockerfile]
            verdicts, scans = [], []
            for _ in range(args.n):
                started = time.perf_counter()
                v = evaluate(plan, t, exit_code=r.exit_code, stderr=r.stderr, calls=r.calls, exits=r.exits,
                             unrehearsable=r.unrehearsable, seconds=r.seconds, timed_out=r.timed_out, timeout_s=60,
                             expected_args=expected, dockerfile_defaults=dict(df.global_args),
                             dockerfiles=contract.dockerfiles, context=r.context, leaks=r.leaks, script_text=script)
                verdicts.append(time.perf_counter() - started)
                started = time.perf_counter()
                runner.read_context(ctx, placeholder_forms(rehearsal_placeholders(plan.env)))
                scans.append(time.perf_counter() - started)
            rows.append((t.key, v.status, len(r.calls), verdicts, scans, r.seconds))
    print(f"rounds: {args.n}; context scanned: {args.mib} MiB written by the script\n")
    print("| target | verdict | stand-in calls | evaluate p50 (ms) | evaluate max (ms) "
          f"| scan {args.mib} MiB p50 (ms) | scan max (ms) | whole run (s) |")
    print("|---|---|---|---|---|---|---|---|")
    for key, status, calls, v, s, whole in rows:
        print(f"| {key} | {status} | {calls} | {_ms(v)} | {_ms(s)} | {whole:.2f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
