"""Benchmark: the whole test suite, run back to back on a loaded machine, as CI runs it.

Why: a test that fails only when the 2-core machine is busy costs every later change a CI re-run
(issue #28). Each run clones the repository's HEAD afresh (``../shared`` beside it, as CI lays it
out), starts ``stress-ng --cpu N`` beside it, runs the README's test command (``scripts/test``) and
samples the load average every 5 s. Prints one Markdown row per run (passed, failed, duration, load
mean/max, the failed tests) and appends them as JSON lines to ``--out``; asserts nothing.
Run: .venv/bin/python bench/suite_under_load.py --runs 5 --stress-cpu 2 [--reuse-venv] [-- PYTEST ARGS]
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# pytest's closing line, bare under -q ("2 failed, 888 passed, 2 skipped in 2249.51s (0:37:29)") or framed.
SUMMARY = re.compile(r"^(?:=+ )?(?P<body>\d+ (?:passed|failed|errors?|skipped)[^=]*?) in (?P<secs>[\d.]+)s")
FAILED = re.compile(r"^(?:FAILED|ERROR) (\S+)")


def _counts(body: str) -> dict[str, int]:
    return {word: int(n) for n, word in re.findall(r"(\d+) (passed|failed|errors?|skipped)", body)}


def _sample_load(stop: threading.Event, samples: list[float]) -> None:
    while not stop.wait(5.0):
        samples.append(float(Path("/proc/loadavg").read_text().split()[0]))


def one_run(n: int, args: argparse.Namespace, pytest_args: list[str]) -> dict:
    top = Path(tempfile.mkdtemp(prefix=f"suite-under-load-{n}-"))
    clone = top / "main"
    subprocess.run(["git", "clone", "-q", str(ROOT), str(clone)], check=True)
    (top / "shared").symlink_to((ROOT.parent / "shared").resolve())
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    if args.reuse_venv:  # the source tree's venv; the clone's modules first on the path
        (clone / ".venv").symlink_to((ROOT / ".venv").resolve())
        env["PYTHONPATH"] = str(clone)
    log = top / "test.log"
    stress = None
    if args.stress_cpu:
        stress = subprocess.Popen(["stress-ng", "--cpu", str(args.stress_cpu), "--quiet"],
                                  stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    stop, samples = threading.Event(), []
    sampler = threading.Thread(target=_sample_load, args=(stop, samples), daemon=True)
    sampler.start()
    started = time.monotonic()
    try:
        with log.open("wb") as out:
            rc = subprocess.run(["bash", "scripts/test", "-q", "-ra", *pytest_args], cwd=clone, env=env,
                                stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL).returncode
    finally:
        stop.set()
        if stress is not None:
            os.killpg(stress.pid, 15)
            stress.wait()
    seconds = time.monotonic() - started
    counts: dict[str, int] = {}
    failed: list[str] = []
    for line in log.read_text(errors="replace").splitlines():
        if m := SUMMARY.match(line):
            counts = _counts(m["body"])
        elif m := FAILED.match(line):
            failed.append(m[1])
    row = {"run": n, "date": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M"),
           "commit": subprocess.run(["git", "-C", str(clone), "rev-parse", "--short", "HEAD"], capture_output=True,
                                    text=True).stdout.strip(),
           "rc": rc, "passed": counts.get("passed", 0), "failed": counts.get("failed", 0),
           "errors": counts.get("error", 0) + counts.get("errors", 0), "skipped": counts.get("skipped", 0),
           "seconds": round(seconds), "load_mean": round(sum(samples) / len(samples), 2) if samples else None,
           "load_max": max(samples, default=None), "stress_cpu": args.stress_cpu, "failed_tests": failed,
           "log": str(log)}
    if not args.keep and rc == 0:
        shutil.rmtree(top, ignore_errors=True)
    return row


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--stress-cpu", type=int, default=2, help="stress-ng CPU workers beside the suite (0: none)")
    ap.add_argument("--reuse-venv", action="store_true", help="use this tree's .venv instead of bootstrapping one")
    ap.add_argument("--keep", action="store_true", help="keep every clone and log (a failed run's always stays)")
    ap.add_argument("--out", type=Path, default=Path("suite_under_load.jsonl"))
    ap.add_argument("--smoke", action="store_true", help="the smallest run that still prints every table, in seconds (tests/bench/test_bench_smoke.py): one run, no stress, this tree's venv, "
                    "one small test file, JSON lines to a temporary file")
    args, pytest_args = ap.parse_known_args()
    pytest_args = [a for a in pytest_args if a != "--"]
    if args.smoke:
        args.runs, args.stress_cpu, args.reuse_venv = 1, 0, True
        args.out = Path(tempfile.mkdtemp(prefix="suite-under-load-smoke-")) / "runs.jsonl"
        pytest_args = pytest_args or ["-n", "0", "tests/domain/test_render.py"]
    if args.stress_cpu and shutil.which("stress-ng") is None:
        sys.exit("stress-ng is not installed (apt-get install stress-ng), or pass --stress-cpu 0")
    print("| run | date (UTC) | commit | rc | passed | failed | errors | duration | load mean / max | failed tests |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for n in range(1, args.runs + 1):
        row = one_run(n, args, pytest_args)
        with args.out.open("a") as f:
            f.write(json.dumps(row) + "\n")
        print(f"| {n} | {row['date']} | {row['commit']} | {row['rc']} | {row['passed']} | {row['failed']} | "
              f"{row['errors']} | {row['seconds'] // 60}m{row['seconds'] % 60:02d}s | "
              f"{row['load_mean']} / {row['load_max']} | {', '.join(row['failed_tests']) or '-'} |", flush=True)


if __name__ == "__main__":
    main()
