"""Benchmark: time to refuse an invalid request (unknown ``--arch``) while one configured Iris controller
is unreachable, and the refusal when no worker polls the task queue.

The sandbox stack (Temporal dev server, real Iris controller, registries, git remotes, GitHub stand-in),
its configuration plus one more cluster whose controller accepts connections and never answers, and a
real ``worker.py`` process on it. Two unknown-``--arch`` rows: that cluster declares its architecture
(the configuration alone refuses), or declares none (the worker's planning refuses, from the script). Wall clock of ``starter.py build`` (interpreter start included), and
how many connections reached the dead controller. Prints a Markdown table; asserts nothing.
Run: .venv/bin/python bench/refusal.py [--rounds 5]
"""

from __future__ import annotations

import argparse
import datetime
import os
import re
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench._stack import add_stack_flag, bench_stack  # noqa: E402

PY = sys.executable
REQUEST = ("--requested-by", "bench", "--reason", "refusal bench")


def run_starter(cfg: Path, *argv: str) -> tuple[float, int, str]:
    t = time.monotonic()
    p = subprocess.run([PY, str(ROOT / "starter.py"), "--config", str(cfg), *argv], cwd=ROOT, capture_output=True,
                       text=True, timeout=180)
    first = (p.stderr.strip() or p.stdout.strip()).splitlines()[:1]
    return time.monotonic() - t, p.returncode, first[0][:110] if first else ""


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=5)
    add_stack_flag(ap)
    ap.add_argument("--smoke", action="store_true", help="the smallest run that still prints every table, in seconds (tests/bench/test_bench_smoke.py)")
    args = ap.parse_args()
    if args.smoke:
        args.rounds = 1
    state = Path(tempfile.mkdtemp(prefix="bench-refusal-"))
    worker = None
    dead = socket.socket()
    try:
        dead.bind(("127.0.0.1", 0))
        dead.listen(256)
        dead.setblocking(False)
        with bench_stack(args.stack, state / "stack", "refusal", github=True) as stack:
            queue = f"bench-refusal-{uuid.uuid4().hex[:6]}"
            text = re.sub(r'task_queue = "[^"]*"', f'task_queue = "{queue}"', stack.config_path.read_text())
            down = (f'\n[clusters.sandbox-down]\ncontroller_url = "http://127.0.0.1:{dead.getsockname()[1]}"\n'
                    f'client_revision_date = "{datetime.date.today().isoformat()}"\n')
            cfg = state / "down.toml"
            cfg.write_text(text + down + 'architecture = "amd64"\n')
            undeclared = state / "undeclared.toml"
            undeclared.write_text(text + down)
            idle = state / "idle.toml"
            idle.write_text(re.sub(r'task_queue = "[^"]*"', f'task_queue = "{queue}-nobody"', text))
            log = open(state / "worker.log", "w")
            worker = subprocess.Popen([PY, str(ROOT / "worker.py"), "--config", str(undeclared)], cwd=ROOT, stdout=log,
                                      stderr=subprocess.STDOUT, env={**os.environ, "PYTHONPATH": str(ROOT)})
            time.sleep(8)  # the worker polls
            rows = []
            for name, conf, argv in (
                    ("unknown --arch, one controller unreachable", cfg, ("--arch", "riscv64")),
                    ("same, that cluster declares no architecture", undeclared, ("--arch", "riscv64")),
                    ("no worker polls the task queue", idle, ("--arch", "amd64"))):
                walls, codes, line = [], set(), ""
                for _ in range(args.rounds):
                    wall, code, line = run_starter(conf, "build", *argv, "--variant", "standard", *REQUEST)
                    walls.append(wall)
                    codes.add(code)
                rows.append((name, statistics.median(walls), max(walls), sorted(codes), line))
            connections = 0
            while True:
                try:
                    dead.accept()[0].close()
                    connections += 1
                except BlockingIOError:
                    break
        print("\n### Time to refuse a request (`starter.py build`, wall clock incl. interpreter start)\n")
        print("| input | p50 s | max s | exit code | first line |")
        print("|---|---:|---:|---|---|")
        for name, p50, mx, codes, line in rows:
            print(f"| {name} | {p50:.2f} | {mx:.2f} | {codes} | {line} |")
        print(f"\nConnections that reached the unreachable controller: {connections} ({args.rounds} rounds)")
    finally:
        if worker:
            worker.terminate()
            worker.wait(30)
        dead.close()
        shutil.rmtree(state, ignore_errors=True)


if __name__ == "__main__":
    main()
