"""Measurement: how many lines the real 0.2.227 controller's log store keeps of a job's output, and what
the store's ``seq`` numbers show about the lines it lost.

Each row runs jobs on a fresh local controller (``sandbox.iris_controller``) that print a marker, then
``seq 1 N`` (numbered lines), then a final marker; after the job is terminal the whole log is read as
``check_build_log`` reads it (``IrisClient.read_complete_log``, re-read until quiet). For each job it
counts the numbered lines stored, whether the first marker survived, and the gaps in the stored
entries' ``seq`` (two consecutive entries of the job whose seq differ by more than 1), and of those the
ones no key of the store fills (``IrisClient.stored_rows_between``: rows the store itself lost).
Concurrent rows start all their jobs at once (the local cluster's workers share one log client each).
Prints a Markdown table; asserts nothing.
Run: .venv/bin/python bench/log_loss.py [--bursts 5000,10000,20000,50000] [--concurrent 10x5000] [--n 3]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import tempfile
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from clients.iris import IrisClient  # noqa: E402
from domain.log_evidence import seq_gaps, unexplained_gaps  # noqa: E402
from sandbox.iris_controller import start_iris_controller  # noqa: E402
from tests.iris.helpers import bash_spec, wait_terminal  # noqa: E402


async def _one(c: IrisClient, burst: int) -> dict:
    name = f"/tester/loss-{uuid.uuid4().hex[:8]}"
    await c.launch_job(bash_spec(name, f"echo MARKER-BEFORE; seq 1 {burst}; echo MARKER-AFTER"))
    await wait_terminal(c, name, 300)
    log = await c.read_complete_log(f"{name}/", "prefix")
    data = [e.data for e in log.entries]
    gaps = seq_gaps((e.key, e.seq) for e in log.entries)
    stored = {(g.after, g.before): await c.stored_rows_between(g.after, g.before) for g in gaps}
    return {"stored": sum(1 for d in data if d.isdigit()), "before": "MARKER-BEFORE" in data,
            "after": "MARKER-AFTER" in data, "gaps": len(gaps), "holes": len(unexplained_gaps(gaps, stored)),
            "first_seq": log.entries[0].seq if log.entries else None}


async def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--bursts", default="5000,10000,20000,50000")
    ap.add_argument("--concurrent", default="10x5000")
    ap.add_argument("--n", type=int, default=3)
    ap.add_argument("--smoke", action="store_true", help="the smallest run that still prints every table, in seconds (tests/bench/test_bench_smoke.py)")
    a = ap.parse_args()
    if a.smoke:
        a.bursts, a.concurrent, a.n = "500", "2x200", 1
    h = start_iris_controller(Path(tempfile.mkdtemp(prefix="bench-log-loss-")), timeout_scan_interval_s=1.0)
    rows = []
    try:
        async with IrisClient(h.url, timeout_s=30.0, cluster_name="local") as c:
            for burst in (int(x) for x in a.bursts.split(",") if x):
                runs = [await _one(c, burst) for _ in range(a.n)]
                rows.append((f"1 job x {burst:,} lines", burst, runs))
            for spec in (x for x in a.concurrent.split(",") if x):
                jobs, burst = (int(v) for v in spec.split("x"))
                runs = await asyncio.gather(*(_one(c, burst) for _ in range(jobs)))
                rows.append((f"{jobs} concurrent jobs x {burst:,} lines", burst, list(runs)))
    finally:
        h.stop()
    print(f"load average {os.getloadavg()[0]:.2f}\n")
    print("| load | jobs | numbered lines stored per job | jobs that lost the first marker | jobs with no line "
          "| seq gaps inside a job (of them, ids no key holds) |")
    print("|---|---|---|---|---|---|")
    for label, burst, runs in rows:
        stored = ", ".join(f"{r['stored']:,}" for r in runs)
        print(f"| {label} | {len(runs)} | {stored} (of {burst:,}) | {sum(not r['before'] for r in runs)} "
              f"| {sum(r['first_seq'] is None for r in runs)} | {sum(r['gaps'] for r in runs)} "
              f"({sum(r['holes'] for r in runs)}) |")


if __name__ == "__main__":
    asyncio.run(main())
