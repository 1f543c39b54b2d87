"""Benchmark: 200 targets' end phases together with the registry giving no verdict (issue 37 item 3).

A real local 0.2.227 controller (``sandbox.iris_controller``) runs N jobs that each print ``--lines`` log
lines and kaniko's push line but not the build's arch line, so only the pushed image could prove that
marker; the registry gives no verdict on the image (``--registry closed``: nothing listens at its address;
``503``: it answers 503 Service Unavailable to everything). Then, in this process (the worker's part),
every target's ``check_build_log`` runs at once, as a worker runs 200 targets ending together, and each is
retried on Temporal's schedule for the step (workflows/options.py: 2 s doubling to 60 s; ``--retry-scale``
shortens it) ``--attempts`` times: each attempt ends Transient ("registry: no verdict").

Requests are counted at a proxy in front of the controller (the activities are configured with the proxy's
address): log requests (``FetchLogs``) per target and per attempt, and per minute per cluster over the end
phase; the bench process's peak RSS (VmHWM: the activities and their clients; the proxy runs in a process of
its own) and its CPU over the end phase. Log requests per target must not grow with retries (a retry reads only new
lines, none once the log was complete: activities/log_reads.py).

Prints a Markdown table; asserts nothing. Run: .venv/bin/python bench/end_phase.py [--targets 200]
[--lines 3000] [--attempts 5] [--registry closed|503] [--retry-scale 1]
"""

from __future__ import annotations

import argparse
import asyncio
import datetime
import http.server
import json
import multiprocessing
import os
import re
import shutil
import signal
import socket
import sys
import tempfile
import threading
import time
import uuid
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from temporalio.testing import ActivityEnvironment  # noqa: E402

from activities.build import BuildActivities  # noqa: E402
from activities.errors import Transient  # noqa: E402
from bench._proxy import RelayProxy  # noqa: E402
from clients.iris import IrisClient  # noqa: E402
from domain.config import ServiceConfig  # noqa: E402
from domain.markers import Marker  # noqa: E402
from domain.models import LogCheckInput  # noqa: E402
from sandbox.iris_controller import start_iris_controller  # noqa: E402
from tests.iris.helpers import bash_spec  # noqa: E402
from tests.workflows.standins import target_input  # noqa: E402
from workflows.options import BACKOFF, INITIAL_INTERVAL, MAX_INTERVAL  # noqa: E402

ARCH_LINE = "[arch] build host=x86_64"


class LogCountingProxy(RelayProxy):
    """A reverse proxy to the controller recording (time, RPC method, job) of every request; the job is
    read from the request body (``FetchLogs`` ``source``, ``GetJobStatus`` ``jobId``)."""

    def __init__(self, upstream: str):
        self.log: list[tuple[float, str, str]] = []
        self._lock = threading.Lock()
        super().__init__(upstream)

    def seen(self, t0: float, rpc: str, body: bytes) -> None:
        job = ""
        try:
            d = json.loads(body or b"{}")
            job = (d.get("source") or d.get("jobId") or d.get("job_id") or "").rstrip("/")
        except ValueError:
            pass
        with self._lock:
            self.log.append((t0, rpc, job))


def _serve_proxy(upstream: str, conn) -> None:
    """The proxy's own process: a proxy's threads and buffers in the worker's process would count in the
    worker's RSS. Sends its URL, then on any message its log, and stops."""
    proxy = LogCountingProxy(upstream)
    conn.send(proxy.url)
    conn.recv()
    conn.send(proxy.log)
    proxy.stop()


class ProxyProcess:
    def __init__(self, upstream: str):
        ctx = multiprocessing.get_context("fork")
        self._conn, child = ctx.Pipe()
        self._proc = ctx.Process(target=_serve_proxy, args=(upstream, child), daemon=True)
        self._proc.start()
        self.url = self._conn.recv()
        self.log: list[tuple[float, str, str]] = []

    def collect(self) -> list[tuple[float, str, str]]:
        self._conn.send("stop")
        self.log = self._conn.recv()
        return self.log

    def stop(self) -> None:
        if self._proc.is_alive():
            self._proc.kill()
        self._proc.join(5)


class Unavailable503:
    """A registry that answers 503 to every request (no verdict on anything)."""

    def __init__(self) -> None:
        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *a):
                pass

            def _503(self):
                body = b'{"errors":[{"code":"UNAVAILABLE","message":"bench: no verdict"}]}'
                self.send_response(503)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                if self.command != "HEAD":
                    self.wfile.write(body)

            do_GET = do_HEAD = do_POST = do_PUT = _503  # noqa: N815

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.host = f"127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def stop(self) -> None:
        self.server.shutdown()


def closed_port() -> int:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def vm_kib(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    return 0


def config(work: Path, url: str, registry_host: str) -> ServiceConfig:
    return ServiceConfig.model_validate({
        "work_dir": str(work),
        "repos": {"marinskyrl_url": "file:///nowhere", "harbor_url": "file:///nowhere"},
        "clusters": {"local": {"controller_url": url, "iris_user": "tester",
                               "client_revision_date": datetime.date.today().isoformat()}},
        "registry": {"image_repository": f"{registry_host}/evidence", "insecure_hosts": [registry_host],
                     "user": {"kind": "literal_public", "value": "u"}, "token": {"kind": "env", "name": "NO_SUCH_X"}},
    })


def retry_delays(attempts: int, scale: float) -> list[float]:
    """Temporal's delays before attempts 2..N of the step (workflows/options.py), times ``scale``."""
    delays, d = [], INITIAL_INTERVAL.total_seconds()
    for _ in range(attempts - 1):
        delays.append(min(d, MAX_INTERVAL.total_seconds()) * scale)
        d *= BACKOFF
    return delays


def kind(e: BaseException) -> str:
    """An error's message without job names and numbers: one outcome per kind, not per target."""
    return re.sub(r"\d+", "N", re.sub(r"/tester/\S+", "<job>", str(e)))[:90]


def pct(values: list[float], q: float) -> float:
    v = sorted(values)
    return v[min(len(v) - 1, max(0, round(q / 100 * (len(v) - 1))))] if v else float("nan")


async def run(args) -> dict:
    state = Path(tempfile.mkdtemp(prefix="bench-end-phase-"))
    ctl = proxy = reg = None
    try:
        ctl = start_iris_controller(state / "iris", timeout_scan_interval_s=1.0)
        proxy = ProxyProcess(ctl.url)
        if args.registry == "503":
            reg = Unavailable503()
            host = reg.host
        else:
            host = f"127.0.0.1:{closed_port()}"
        repo, tag = f"{host}/evidence", "t1"
        run_id = uuid.uuid4().hex[:6]
        names = [f"/tester/end-{run_id}-{i:04d}" for i in range(args.targets)]
        # A build-like log: --lines lines of ~100 bytes, then kaniko's push; the arch line is missing.
        script = (f"seq -f 'INFO[%05g] layer sha256:0123456789abcdef0123456789abcdef cached: RUN pip install "
                  f"-r requirements.txt' 1 {args.lines}; echo 'Pushing image to {repo}:{tag}'")
        t_submit = time.time()
        async with IrisClient(ctl.url, timeout_s=60.0, cluster_name="local") as c:
            sem = asyncio.Semaphore(16)

            async def launch(name: str) -> None:
                async with sem:
                    await c.launch_job(bash_spec(name, script))
            await asyncio.gather(*(launch(n) for n in names))
            deadline = time.monotonic() + args.job_timeout
            while True:
                states = await c.job_states(names)
                done = [n for n in names if states.get(n) and states[n].is_terminal]
                if len(done) == len(names) or time.monotonic() > deadline:
                    break
                await asyncio.sleep(1.0)
            bad = {n: states[n].value for n in done if states[n].value != "succeeded"}
            if len(done) < len(names) or bad:
                raise SystemExit(f"only {len(done)} of {len(names)} jobs ended within {args.job_timeout:.0f} s; "
                                 f"not succeeded: {dict(list(bad.items())[:5])}")
        print(f"{len(names)} jobs of {args.lines} lines ended after {time.time() - t_submit:.0f} s", file=sys.stderr,
              flush=True)

        acts = BuildActivities(config(state / "work", proxy.url, host))
        if args.slots:
            acts.log_reads.slots = args.slots  # 10,000: every end phase holds its log at once (before the slots)
        target = target_input("end-phase").target.model_copy(update={
            "expected_markers": [Marker(name=ARCH_LINE, text=ARCH_LINE, source="script", image_proof="script"),
                                 Marker(name=f"push {repo}:{tag}", text=f"Pushing image to {repo}:{tag}",
                                        source="kaniko", role="push")],
            "image_repository": repo, "tag": tag})
        delays = retry_delays(args.attempts, args.retry_scale)
        outcomes: Counter = Counter()
        attempt_spans: dict[str, list[tuple[float, float]]] = {}

        async def end_phase(name: str) -> None:
            inp = LogCheckInput(request_id=f"end-{run_id}", job_id=name, cluster="local", target=target,
                                build_commit="1" * 40, harbor_commit="2" * 40)
            spans = attempt_spans.setdefault(name, [])
            for k in range(args.attempts):
                t0 = time.time()
                try:
                    await ActivityEnvironment().run(acts.check_build_log, inp)
                    outcomes["passed"] += 1
                except Transient as e:
                    outcomes["no verdict" if "no verdict" in str(e) else f"transient: {kind(e)}"] += 1
                except Exception as e:  # noqa: BLE001 - counted and shown, never hidden
                    outcomes[f"{type(e).__name__}: {kind(e)}"] += 1
                spans.append((t0, time.time()))
                done[k] += 1
                if done[k] in (1, len(names)):
                    print(f"attempt {k + 1}: {'first' if done[k] == 1 else 'all'} done after {time.time() - phase0:.0f} s, "
                          f"RSS {vm_kib('VmRSS') / 1024:.0f} MiB", file=sys.stderr, flush=True)
                if k < len(delays):
                    await asyncio.sleep(delays[k])

        done = Counter()
        phase0 = time.time()
        cpu0, t0 = time.process_time(), time.time()
        rss_before = vm_kib("VmRSS")
        await asyncio.gather(*(end_phase(n) for n in names))
        t1, cpu = time.time(), time.process_time() - cpu0
        rss_peak = vm_kib("VmHWM")
        proxy.collect()
        logs = [(t, j) for t, m, j in proxy.log if m == "FetchLogs" and t0 <= t <= t1]
        # Per target: every FetchLogs its end phases sent (reads and the gap checks of its log, which name no
        # job on the wire), as the worker counted them beside the saved log (activities/log_reads.py).
        per_target = {n: (acts.log_reads.load(n).requests if acts.log_reads.load(n) else 0) for n in names}
        per_attempt: list[list[int]] = []  # target -> log requests of each attempt
        for name, spans in attempt_spans.items():
            mine = [t for t, j in logs if j == name]
            per_attempt.append([sum(1 for t in mine if a <= t <= b) for a, b in spans])
        first = [p[0] for p in per_attempt]
        retries = [sum(p[1:]) for p in per_attempt]
        minutes = max(t1 - t0, 1e-9) / 60
        status = [m for t, m, _ in proxy.log if t0 <= t <= t1 and m in ("GetJobState", "GetJobStatus", "ListJobs")]
        return {"targets": len(names), "lines": args.lines, "registry": args.registry, "attempts": args.attempts,
                "slots": acts.log_reads.slots,
                "outcomes": dict(outcomes), "first_p50": pct(first, 50), "first_max": max(first),
                "retry_total_max": max(retries), "per_target_max": max(per_target.values(), default=0),
                "per_target_p50": pct(list(per_target.values()), 50), "log_total": len(logs),
                "log_per_min": len(logs) / minutes, "status": len(status), "wall_s": t1 - t0,
                "rss_before_mib": rss_before / 1024, "rss_peak_mib": rss_peak / 1024,
                "cpu_cores": cpu / max(t1 - t0, 1e-9)}
    finally:
        for s in (proxy, reg):
            if s is not None:
                s.stop()
        if ctl is not None:
            ctl.stop()
        shutil.rmtree(state, ignore_errors=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--targets", type=int, default=200, help="jobs whose end phases run together")
    ap.add_argument("--lines", type=int, default=3000, help="log lines each job prints (~100 bytes each)")
    ap.add_argument("--attempts", type=int, default=5, help="check_build_log attempts per target (1 + retries)")
    ap.add_argument("--registry", choices=("closed", "503"), default="503",
                    help="how the registry gives no verdict: nothing listens (closed) or it answers 503")
    ap.add_argument("--retry-scale", type=float, default=1.0,
                    help="multiply Temporal's retry delays of the step (2 s doubling to 60 s) by this")
    ap.add_argument("--slots", type=int, default=0, help="end phases holding a whole log at once in the worker "
                    "(activities/log_reads.py LOG_SLOTS by default; 10000: unbounded, as before)")
    ap.add_argument("--job-timeout", type=float, default=900.0, help="seconds for every job to end")
    ap.add_argument("--smoke", action="store_true", help="the smallest run that still prints the table, in "
                    "seconds (tests/bench/test_bench_smoke.py): 4 targets of 200 lines, 3 attempts, delays / 10")
    args = ap.parse_args()
    if args.smoke:
        args.targets, args.lines, args.attempts, args.retry_scale = 4, 200, 3, 0.1
    load = os.getloadavg()
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # a stopped bench still stops its controller
    r = asyncio.run(run(args))
    print(f"\n### End phases with the registry giving no verdict ({datetime.datetime.now(datetime.UTC):%Y-%m-%d %H:%M} "
          f"UTC, load {load[0]:.1f} at start, {os.getloadavg()[0]:.1f} at end)\n")
    print("| targets | log lines each | registry | log slots | attempts each | outcomes | reads per target: first attempt "
          "p50 / max | reads in all retries max | all log req per target p50 / max | log req per cluster (per min) | "
          "status req | end phase s | worker peak RSS MiB (before) | worker CPU cores |")
    print("|---:|---:|---|---:|---:|---|---|---:|---:|---:|---:|---:|---:|---:|")
    print(f"| {r['targets']} | {r['lines']} | {r['registry']} | {r['slots']} | {r['attempts']} | "
          f"{', '.join(f'{k} {v}' for k, v in r['outcomes'].items())} | {r['first_p50']:g} / {r['first_max']} | "
          f"{r['retry_total_max']} | {r['per_target_p50']:g} / {r['per_target_max']} | {r['log_total']} "
          f"({r['log_per_min']:.1f}) | {r['status']} | "
          f"{r['wall_s']:.1f} | {r['rss_peak_mib']:.0f} ({r['rss_before_mib']:.0f}) | {r['cpu_cores']:.2f} |")


if __name__ == "__main__":
    main()
