"""Benchmark: monitoring running Iris jobs through the per-cluster watcher.

Starts a Temporal dev server, the real local Iris controller, a counting HTTP proxy in front of the
controller (what the watcher sends is counted on the wire) and bench/monitor_worker.py as a separate
process (real TargetBuildWorkflow, IrisWatcherWorkflow and watch activities; scripted stand-ins for
submit's bundle, log check and validation). Then:

1. scale: for each N, N targets whose jobs run together and end at known times (spread over
   ``--spread`` s): detection latency (controller's finished_at → the target schedules its log check)
   p50/p95, Iris requests per minute per cluster and per target while all N jobs run, worker CPU/RSS;
2. history: one target, the production policy compressed ``--compress`` times (every interval divided),
   a job of one compressed build-hour printing a marker every ~7 minutes: history events and bytes per
   build-hour while monitoring;
3. resume: SIGKILL the worker while the watcher polls, start a new one at once: time from the new
   worker's start to the watcher's next heartbeat, and to the target acting on its job's end;
4. reject: wall time of ``starter.py build`` refusing invalid input (exit 2).

Prints Markdown tables; asserts nothing.
Run: .venv/bin/python bench/monitoring.py [--sizes 1,10,50,100,200] [--skip history,resume,reject]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import datetime
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import httpx  # noqa: E402
from temporalio.api.enums.v1 import EventType  # noqa: E402
from temporalio.client import Client  # noqa: E402
from temporalio.contrib.pydantic import pydantic_data_converter  # noqa: E402

from bench._proxy import RelayProxy  # noqa: E402
from bench.pipeline_e2e import proc_cpu_s, proc_hwm_kib  # noqa: E402
from clients.iris import IrisClient  # noqa: E402
from domain.config import PolicySettings  # noqa: E402
from domain.watch import watcher_id  # noqa: E402
from sandbox.iris_controller import start_iris_controller  # noqa: E402
from sandbox.temporal_server import start_temporal_dev_server  # noqa: E402
from tests.workflows.standins import plan, target_input  # noqa: E402
from workflows.target import TargetBuildWorkflow  # noqa: E402

PY = sys.executable
STATUS_METHODS = ("GetJobState", "GetJobStatus", "ListJobs", "ListTasks")
FEED_READ = "FetchLogs(feed)"


# ------------------------------------------------------------------------------ counting proxy
TERMINAL_STATES = {"JOB_STATE_SUCCEEDED", "JOB_STATE_FAILED", "JOB_STATE_KILLED", "JOB_STATE_WORKER_FAILED",
                   "JOB_STATE_UNSCHEDULABLE", "succeeded", "failed", "killed", "worker_failed", "unschedulable"}


def terminal_ids(method: str, content: bytes) -> list[str]:
    """Job ids a status reply reports in a terminal state (what the watcher learns from it)."""
    if method not in ("GetJobState", "ListJobs", "GetJobStatus"):
        return []
    try:
        d = json.loads(content)
    except ValueError:
        return []
    if method == "GetJobState":
        return [j for j, st in (d.get("states") or {}).items() if str(st) in TERMINAL_STATES]
    jobs = d.get("jobs") or ([d["job"]] if d.get("job") else [])
    return [j.get("jobId", "") for j in jobs if str(j.get("state")) in TERMINAL_STATES]


class CountingProxy(RelayProxy):
    """A reverse proxy to the controller that records (time, RPC method) of every request, how long the
    controller took to answer it, and when a status reply first reported each job terminal."""

    def __init__(self, upstream: str):
        self.log: list[tuple[float, str]] = []
        self.latency: list[tuple[float, str, float]] = []  # (start, method, seconds to the reply)
        self.first_terminal: dict[str, float] = {}  # job id -> when a reply first said it is terminal
        self._lock = threading.Lock()
        super().__init__(upstream, methods=("POST", "GET"))

    def seen(self, t0: float, rpc: str, body: bytes) -> None:
        if rpc == "FetchLogs" and b'"/system/controller"' in body:
            rpc = FEED_READ  # the watcher's audit feed (log requests), counted apart from its progress log reads
        with self._lock:
            self.log.append((t0, rpc))

    def answered(self, t0: float, t1: float, rpc: str, reply: httpx.Response) -> None:
        ended = terminal_ids(rpc, reply.content) if reply.status_code == 200 else []
        with self._lock:
            self.latency.append((t0, rpc, t1 - t0))
            for j in ended:
                self.first_terminal.setdefault(j, t1)

    def count(self, since: float, until: float) -> Counter:
        return Counter(m for t, m in self.log if since <= t <= until)

    def latencies(self, since: float, until: float) -> dict[str, dict]:
        """Per RPC method between two times: requests, p50/p95/max seconds to the controller's reply."""
        by: dict[str, list[float]] = {}
        for t, m, d in self.latency:
            if since <= t <= until:
                by.setdefault(m, []).append(d)
        return {m: {"n": len(v), "p50": round(pct(v, 50), 3), "p95": round(pct(v, 95), 3), "max": round(max(v), 3)}
                for m, v in sorted(by.items())}


# ------------------------------------------------------------------------------ worker process
class BenchWorker:
    def __init__(self, temporal: str, tq: str, proxy: str, controller: str, cluster: str, policy: PolicySettings,
                 work: Path, log: Path):
        self.args = [PY, str(ROOT / "bench" / "monitor_worker.py"), "--temporal", temporal, "--task-queue", tq,
                     "--iris-url", proxy, "--submit-url", controller, "--cluster", cluster,
                     "--policy", policy.model_dump_json(), "--work-dir", str(work)]
        self.log = log
        self.proc: subprocess.Popen | None = None

    def start(self) -> BenchWorker:
        self.proc = subprocess.Popen(self.args, cwd=ROOT, start_new_session=True, stdout=self.log.open("a"),
                                     stderr=subprocess.STDOUT)
        return self

    @property
    def pid(self) -> int:
        return self.proc.pid

    def kill(self) -> None:
        if self.proc and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()

    def stop(self) -> None:
        if self.proc and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.kill()


def proc_sched_s(pid: int) -> tuple[float, float]:
    """Seconds ``pid``'s live threads ran on a CPU, and waited runnable for one (/proc/PID/task/*/schedstat):
    a worker that waits much longer than it runs is starved by the machine, not busy."""
    run = wait = 0
    for f in Path(f"/proc/{pid}/task").glob("*/schedstat"):
        with contextlib.suppress(OSError, ValueError, IndexError):
            fields = f.read_text().split()
            run, wait = run + int(fields[0]), wait + int(fields[1])
    return run / 1e9, wait / 1e9


def proc_rss_kib(pid: int) -> int:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    except OSError:
        pass
    return 0


# ------------------------------------------------------------------------------ helpers
def pct(values: list[float], q: float) -> float | None:
    if not values:
        return None
    v = sorted(values)
    return v[min(len(v) - 1, max(0, round(q / 100 * len(v) + 0.5) - 1))]


def fmt(v, nd=1) -> str:
    return "-" if v is None else f"{v:.{nd}f}"


async def start_targets(client: Client, tq: str, cluster: str, ids_ends: list[tuple[str, int]]):
    target = plan()[0].model_copy(update={"cluster": cluster})
    sem = asyncio.Semaphore(20)

    async def one(wid: str):
        async with sem:
            return await client.start_workflow(TargetBuildWorkflow.run, target_input(wid, target), id=wid,
                                               task_queue=tq)
    return await asyncio.gather(*(one(wid) for wid, _ in ids_ends))


async def acted_at(client: Client, wid: str) -> tuple[float | None, int, int, dict]:
    """When the target scheduled check_build_log (acted on the terminal state); its events and bytes;
    the monitoring slice (watch_job scheduled → check_build_log scheduled): events, bytes."""
    events = list((await client.get_workflow_handle(wid).fetch_history()).events)
    t_act = None
    first_watch = None
    for e in events:
        if e.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED:
            name = e.activity_task_scheduled_event_attributes.activity_type.name
            if name == "watch_job" and first_watch is None:
                first_watch = e.event_id
            if name in ("check_build_log", "capture_failure") and t_act is None:
                t_act = e.event_time.ToMicroseconds() / 1e6
                act_id = e.event_id
    mon = [e for e in events if first_watch is not None and t_act is not None and first_watch <= e.event_id < act_id]
    kinds = Counter(EventType.Name(e.event_type).removeprefix("EVENT_TYPE_").lower() for e in mon)
    return t_act, len(events), sum(e.ByteSize() for e in events), {
        "events": len(mon), "bytes": sum(e.ByteSize() for e in mon), "kinds": kinds}


async def timeline(client: Client, wid: str) -> dict:
    """One target's monitoring milestones (epoch s): its first watch_job completed (registered with the
    watcher), the wake-up it acted on (the last job_changed signal before check_build_log, or for the ``wake``
    update, the acting task's scheduled time: when the server admitted the update), and when it scheduled
    check_build_log."""
    events = list((await client.get_workflow_handle(wid).fetch_history()).events)
    watch_sched, submit_sched = None, None
    out = {"submitted": None, "registered": None, "signalled": None, "acted": None,
           "task_scheduled": None, "task_started": None, "task_completed": None, "task_timeouts": 0}
    at_id = {e.event_id: e.event_time.ToMicroseconds() / 1e6 for e in events}
    for e in events:
        at = e.event_time.ToMicroseconds() / 1e6
        if e.event_type == EventType.EVENT_TYPE_WORKFLOW_TASK_TIMED_OUT:
            out["task_timeouts"] += 1
        if e.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED:
            name = e.activity_task_scheduled_event_attributes.activity_type.name
            if name == "watch_job" and watch_sched is None:
                watch_sched = e.event_id
            if name == "submit_job" and submit_sched is None:
                submit_sched = e.event_id
            if name in ("check_build_log", "capture_failure"):
                out["acted"] = at
                # The workflow task that acted: when it was scheduled (after the wake-up signal), picked
                # up by the worker (started) and completed, on the server's clock.
                done = e.activity_task_scheduled_event_attributes.workflow_task_completed_event_id
                d = next((x.workflow_task_completed_event_attributes for x in events if x.event_id == done), None)
                if d is not None:
                    sched = next(x for x in events if x.event_id == d.scheduled_event_id)
                    kind = sched.workflow_task_scheduled_event_attributes.task_queue.kind
                    out["task_queue"] = "sticky" if kind == 2 else "normal"  # TASK_QUEUE_KIND_STICKY
                    out["task_attempt"] = sched.workflow_task_scheduled_event_attributes.attempt
                    out["task_scheduled"] = at_id.get(d.scheduled_event_id)
                    out["task_started"] = at_id.get(d.started_event_id)
                    out["task_completed"] = at_id.get(done)
                    # Woken by the ``wake`` update (issue 37): the task ran speculatively and was written with
                    # its completion; it was scheduled when the server admitted the update (the wake-up sent).
                    if any(x.event_type == EventType.EVENT_TYPE_WORKFLOW_EXECUTION_UPDATE_ACCEPTED
                           and done < x.event_id <= done + 8 for x in events):
                        out["signalled"] = out["task_scheduled"]
                        out["woken_by"] = "update"
                break
        elif e.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_COMPLETED:
            if e.activity_task_completed_event_attributes.scheduled_event_id == watch_sched:
                out["registered"] = at
            if e.activity_task_completed_event_attributes.scheduled_event_id == submit_sched:
                out["submitted"] = at
        elif e.event_type == EventType.EVENT_TYPE_WORKFLOW_EXECUTION_SIGNALED:
            if e.workflow_execution_signaled_event_attributes.signal_name == "job_changed":
                out["signalled"] = at
    return out


def stages(ends: dict[str, float], seen: dict[str, float], tl: dict[str, dict]) -> dict[str, dict]:
    """p50/p95/max of each step of a detection: the controller's finished_at → a status reply to the
    watcher says terminal → the target is signalled → it schedules check_build_log; only jobs that were
    registered with the watcher before they ended (the others ended before their target watched)."""
    steps: dict[str, list[float]] = {"end→seen": [], "seen→signal": [], "signal→act": [], "end→act": [],
                                     "signal→task scheduled": [], "task scheduled→started": [],
                                     "task started→completed": [], "ended before registered: end→act": []}
    for wid, end in ends.items():
        t = tl[wid]
        if t["registered"] is None or t["registered"] > end:
            if t["acted"]:
                steps["ended before registered: end→act"].append(t["acted"] - end)
            continue
        s = seen.get(f"/bench/{wid}")
        if s is not None:
            steps["end→seen"].append(s - end)
            if t["signalled"]:
                steps["seen→signal"].append(t["signalled"] - s)
        if t["signalled"] and t["acted"]:
            steps["signal→act"].append(t["acted"] - t["signalled"])
            if t.get("task_completed"):  # the acting workflow task: queued on the server, then on the worker
                steps["signal→task scheduled"].append(t["task_scheduled"] - t["signalled"])
                steps["task scheduled→started"].append(t["task_started"] - t["task_scheduled"])
                steps["task started→completed"].append(t["task_completed"] - t["task_started"])
        if t["acted"]:
            steps["end→act"].append(t["acted"] - end)
    def r(x):
        return None if x is None else round(x, 2)
    out: dict = {k: {"n": len(v), "p50": r(pct(v, 50)), "p95": r(pct(v, 95)), "max": r(max(v, default=None))}
                 for k, v in steps.items()}
    out["workflow task timeouts"] = sum(t.get("task_timeouts", 0) for t in tl.values())
    out["acting task on queue"] = dict(Counter(t.get("task_queue") for t in tl.values() if t.get("task_queue")))
    out["woken by"] = dict(Counter(t.get("woken_by", "signal") for t in tl.values() if t.get("acted")))
    subs = sorted(t["submitted"] for t in tl.values() if t["submitted"])
    if subs:
        out["submissions"] = {"n": len(subs), "first_to_last_s": r(subs[-1] - subs[0]),
                              "last_before_first_end_s": r(min(ends.values(), default=0) - subs[-1])}
    return out


def dump(path: Path, data: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data))


async def wait_closed(client: Client, handles, within_s: float) -> None:
    deadline = time.monotonic() + within_s
    for h in handles:
        left = max(1.0, deadline - time.monotonic())
        with contextlib.suppress(Exception):
            await asyncio.wait_for(h.result(), left)


# ------------------------------------------------------------------------------ 1. scale
async def scale(args, client, iris: IrisClient, proxy: CountingProxy, worker: BenchWorker, tq: str, cluster: str,
                controller_pid: int, server_pid: int = 0) -> list[dict]:
    rows = []
    for n in args.sizes:
        run = uuid.uuid4().hex[:6]
        lead = args.lead + n * args.lead_per_job  # time to submit and start everything before the first end
        t0 = time.time()
        first_end = int(t0 + lead)
        ends = [first_end + int(args.spread * i / max(1, n - 1)) if n > 1 else first_end for i in range(n)]
        ids_ends = [(f"bench-{run}-n{n}-{i}-e{end}", end) for i, end in enumerate(ends)]
        cpu0, ctl0, w0 = proc_cpu_s(worker.pid), proc_cpu_s(controller_pid), time.monotonic()
        srv0, load0, sched0 = proc_cpu_s(server_pid), os.getloadavg()[0], proc_sched_s(worker.pid)
        print(f"scale N={n}: starting targets (first job ends in {lead:.0f}s)", file=sys.stderr, flush=True)
        handles = await start_targets(client, tq, cluster, ids_ends)
        # Steady window: every job running, none finished.
        all_running = None
        rss_peak = 0
        while time.time() < first_end - 1:
            rss_peak = max(rss_peak, proc_rss_kib(worker.pid))
            if all_running is None:
                jobs = await iris.list_jobs(prefix=f"/bench/bench-{run}-", state="running", limit=5000)
                if len(jobs) == n:
                    all_running = time.time()
            await asyncio.sleep(1.0)
        window = (all_running, first_end - 1) if all_running else None
        await wait_closed(client, handles, within_s=args.spread + 180)
        rss_peak = max(rss_peak, proc_rss_kib(worker.pid))
        wall = time.monotonic() - w0
        cpu, ctl = proc_cpu_s(worker.pid) - cpu0, proc_cpu_s(controller_pid) - ctl0
        srv = proc_cpu_s(server_pid) - srv0
        sched = proc_sched_s(worker.pid)
        ran, waited = sched[0] - sched0[0], sched[1] - sched0[1]
        latencies, failed, finished, tls = [], 0, {}, {}
        for wid, _ in ids_ends:
            tls[wid] = await timeline(client, wid)
            t_act = tls[wid]["acted"]
            info = await iris.job_status(f"/bench/{wid}", with_tasks=False)
            if t_act is None or not info.finished_at_ms:
                failed += 1
                continue
            finished[wid] = info.finished_at_ms / 1000
            latencies.append(t_act - info.finished_at_ms / 1000)
        t_end = time.time()
        print(f"scale N={n}: steps {stages(finished, proxy.first_terminal, tls)}", file=sys.stderr, flush=True)
        print(f"scale N={n}: controller latency while the jobs ended "
              f"{proxy.latencies(first_end - 5, first_end + args.spread + 70)}", file=sys.stderr, flush=True)
        print(f"scale N={n}: controller latency whole step {proxy.latencies(t0, t_end)}", file=sys.stderr, flush=True)
        print(f"scale N={n}: status requests while the jobs ended "
              f"{dict(proxy.count(first_end - 5, first_end + args.spread + 70))}", file=sys.stderr, flush=True)
        if args.dump:
            dump(Path(args.dump) / f"n{n}.json", {
                "t0": t0, "first_end": first_end, "finished": finished, "timelines": tls,
                "seen": {k: v for k, v in proxy.first_terminal.items() if f"-n{n}-" in k},
                "requests": [(t, m, d) for t, m, d in proxy.latency if t0 <= t <= t_end]})
            if worker.log.exists():
                shutil.copy(worker.log, Path(args.dump) / f"n{n}-worker.log")
        polls = sorted(t for t, m in proxy.log if m in ("GetJobState", "ListJobs") and t0 <= t <= t_end)
        gaps = [(round(b - first_end, 1), round(b - a, 1)) for a, b in zip(polls, polls[1:], strict=False) if b - a > 6]
        print(f"scale N={n}: poll gaps > 6 s (s after the first end, gap s): {gaps}", file=sys.stderr, flush=True)
        if worker.log.exists():
            warnings = [ln for ln in worker.log.read_text(errors="replace").splitlines()
                        if "stalled" in ln or "could not" in ln or "failed" in ln.lower()]
            print(f"scale N={n}: worker log warnings so far: {len(warnings)}; last: {warnings[-5:]}",
                  file=sys.stderr, flush=True)
        # Every status request of the step, registrations included (issue 37: they were outside the window).
        status_at = sorted(t for t, m in proxy.log if m in STATUS_METHODS and t0 <= t <= t_end)
        most_in_60 = max((sum(1 for u in status_at if t - 60 < u <= t) for t in status_at), default=0)
        row = {"n": n, "p50": pct(latencies, 50), "p95": pct(latencies, 95), "max": max(latencies, default=None),
               "most_status_in_60s": most_in_60,
               "failed": failed, "worker_cpu_cores": cpu / wall, "worker_rss_mib": rss_peak / 1024,
               "controller_cpu_cores": ctl / wall, "server_cpu_cores": srv / wall,
               "load": f"{load0:.1f}-{os.getloadavg()[0]:.1f}", "window_s": None,
               "worker_waited_per_ran_s": waited / ran if ran else None}
        if window and window[1] - window[0] >= 10:
            c = proxy.count(*window)
            minutes = (window[1] - window[0]) / 60
            status = sum(c[m] for m in STATUS_METHODS)
            row.update(window_s=window[1] - window[0], status_per_min=status / minutes,
                       getjobstate_per_min=c["GetJobState"] / minutes, logs_per_min=c["FetchLogs"] / minutes,
                       status_per_min_target=status / minutes / n, logs_per_min_target=c["FetchLogs"] / minutes / n,
                       feed_per_min=c[FEED_READ] / minutes, by_method=dict(c))
        rows.append(row)
        print(f"scale N={n}: {row}", file=sys.stderr, flush=True)
    return rows


# ------------------------------------------------------------------------------ 2. history per build-hour
async def history(args, client, tq: str, cluster: str) -> dict:
    run = uuid.uuid4().hex[:6]
    hour = 3600 / args.compress
    end = int(time.time() + 5 + hour)
    wid = f"bench-{run}-hist-e{end}"
    (h,) = await start_targets(client, tq, cluster, [(wid, end)])
    print(f"history: one compressed build-hour ({hour:.0f}s)", file=sys.stderr, flush=True)
    await wait_closed(client, [h], within_s=hour + 180)
    _, total_events, total_bytes, mon = await acted_at(client, wid)
    return {"hour_s": hour, "total_events": total_events, "total_bytes": total_bytes, **mon}


# ------------------------------------------------------------------------------ 3. resume after SIGKILL
async def heartbeat_time(client: Client, cluster: str, tq: str) -> tuple[float | None, int]:
    try:
        desc = await client.get_workflow_handle(watcher_id(cluster, tq)).describe()
    except Exception:  # noqa: BLE001
        return None, 0
    for p in desc.raw_description.pending_activities:
        if p.activity_type.name == "watch_cluster" and p.HasField("last_heartbeat_time"):
            return p.last_heartbeat_time.ToMicroseconds() / 1e6, p.attempt
    return None, 0


async def resume(args, client, make_worker, tq: str, cluster: str, iris: IrisClient) -> list[dict]:
    out = []
    for k in range(args.resume_rounds):
        run = uuid.uuid4().hex[:6]
        end = int(time.time() + args.resume_job_s)
        worker = make_worker().start()
        wid = f"bench-{run}-resume-e{end}"
        (h,) = await start_targets(client, tq, cluster, [(wid, end)])
        for _ in range(240):  # the watcher is polling (it has heartbeated)
            if (await heartbeat_time(client, cluster, tq))[0] is not None:
                break
            await asyncio.sleep(0.5)
        await asyncio.sleep(3)
        worker.kill()
        t_kill = time.time()
        worker2 = make_worker().start()
        t_new = time.time()
        hb = None
        while time.time() - t_new < 120:
            t_hb, _attempt = await heartbeat_time(client, cluster, tq)
            if t_hb and t_hb > t_new:
                hb = t_hb
                break
            await asyncio.sleep(0.2)
        await wait_closed(client, [h], within_s=args.resume_job_s + 120)
        t_act, *_ = await acted_at(client, wid)
        info = await iris.job_status(f"/bench/{wid}", with_tasks=False)
        worker2.stop()
        out.append({"round": k + 1, "resume_s": None if hb is None else hb - t_new,
                    "kill_to_poll_s": None if hb is None else hb - t_kill,
                    "end_to_act_s": None if t_act is None or not info.finished_at_ms
                    else t_act - info.finished_at_ms / 1000})
        print(f"resume: {out[-1]}", file=sys.stderr, flush=True)
    return out


# ------------------------------------------------------------------------------ 4. reject invalid input
def reject(args, temporal_address: str, state: Path) -> list[dict]:
    config = state / "starter-config.toml"
    config.write_text(f"""work_dir = "{state / 'starter-work'}"
[temporal]
address = "{temporal_address}"
[repos]
marinskyrl_url = "file:///nowhere"
harbor_url = "file:///nowhere"
[clusters.c]
controller_url = "http://127.0.0.1:9"
client_revision_date = "{datetime.date.today().isoformat()}"
[registry]
image_repository = "127.0.0.1:5000/gpu-rl"
user = {{ kind = "literal_public", value = "u" }}
token = {{ kind = "env", name = "X" }}
""")
    cases = {
        "empty --reason": ["--arch", "amd64", "--requested-by", "a", "--reason", " "],
        "empty --requested-by": ["--arch", "amd64", "--requested-by", "", "--reason", "bench"],
        "unknown --arch (needs the contract: repository unreadable here)": [
            "--arch", "sparc", "--requested-by", "a", "--reason", "bench"],
    }
    rows = []
    for name, argv in cases.items():
        walls, codes = [], set()
        for _ in range(args.reject_rounds):
            t = time.monotonic()
            p = subprocess.run([PY, str(ROOT / "starter.py"), "--config", str(config), "build", *argv], cwd=ROOT,
                               capture_output=True, text=True, timeout=120)
            walls.append(time.monotonic() - t)
            codes.add(p.returncode)
            first_line = (p.stderr.strip() or p.stdout.strip()).splitlines()[:1]
        rows.append({"case": name, "p50": statistics.median(walls), "max": max(walls), "exit": sorted(codes),
                     "message": first_line[0][:100] if first_line else ""})
    return rows


# ------------------------------------------------------------------------------ main
def print_tables(args, policy: PolicySettings, sc, hist, res, rej) -> None:
    if sc:
        print(f"\n### Detection and Iris load by concurrent running jobs (watch interval {policy.watch_interval_s:g} s, "
              f"progress every {policy.watch_progress_interval_s:g} s)\n")
        print("| running jobs | detection p50 s | p95 s | max s | status req/min per cluster | GetJobState/min | "
              "status req/min per target | log req/min per cluster | log req/min per target | feed req/min per cluster | "
              "worker CPU (cores) | worker peak RSS MiB | "
              "controller CPU (cores) | Temporal server CPU (cores) | steady window s | not measured | load average |")
        print("|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
        for r in sc:
            print(f"| {r['n']} | {fmt(r['p50'], 2)} | {fmt(r['p95'], 2)} | {fmt(r['max'], 2)} | "
                  f"{fmt(r.get('status_per_min'))} | {fmt(r.get('getjobstate_per_min'))} | "
                  f"{fmt(r.get('status_per_min_target'), 3)} | {fmt(r.get('logs_per_min'), 1)} | "
                  f"{fmt(r.get('logs_per_min_target'), 3)} | {fmt(r.get('feed_per_min'), 1)} | "
                  f"{fmt(r['worker_cpu_cores'], 2)} | {fmt(r['worker_rss_mib'], 0)} | {fmt(r['controller_cpu_cores'], 2)} | "
                  f"{fmt(r.get('server_cpu_cores'), 2)} | {fmt(r['window_s'], 0)} | {r['failed']} | {r.get('load', '-')} |")
        print("\nMost status requests in any 60 s of the whole step (registrations included): " + "; ".join(
            f"N={r['n']}: {r['most_status_in_60s']}" for r in sc))
        print("\nRequests by method in the steady window: " + "; ".join(
            f"N={r['n']}: " + ", ".join(f"{k} {v}" for k, v in sorted(r.get('by_method', {}).items())) for r in sc))
    if hist:
        k = hist["kinds"]
        print(f"\n### Target history while monitoring, per build-hour (production policy compressed {args.compress}×: "
              f"one build-hour = {hist['hour_s']:.0f} s)\n")
        print("| measure | value |")
        print("|---|---:|")
        print(f"| events while monitoring (watch_job → check_build_log) | {hist['events']} |")
        print(f"| bytes of those events | {hist['bytes']:,} |")
        print(f"| of which activity events | {sum(v for n, v in k.items() if n.startswith('activity'))} |")
        print(f"| wake-up signals | {k.get('workflow_execution_signaled', 0)} |")
        print(f"| timers started (safety) | {k.get('timer_started', 0)} |")
        print(f"| whole target history (events / bytes) | {hist['total_events']} / {hist['total_bytes']:,} |")
    if res:
        print("\n### Resume after SIGKILL of the worker while the watcher polls\n")
        print("| round | new worker start → watcher polls again (s) | kill → polls again (s) | job ends → target acts (s) |")
        print("|---:|---:|---:|---:|")
        for r in res:
            print(f"| {r['round']} | {fmt(r['resume_s'])} | {fmt(r['kill_to_poll_s'])} | {fmt(r['end_to_act_s'])} |")
    if rej:
        print("\n### Time to reject an invalid request (`starter.py build`, wall clock incl. interpreter start)\n")
        print("| input | p50 s | max s | exit code | first line |")
        print("|---|---:|---:|---|---|")
        for r in rej:
            print(f"| {r['case']} | {r['p50']:.2f} | {r['max']:.2f} | {r['exit']} | {r['message']} |")


async def main_async(args) -> int:
    state = Path(tempfile.mkdtemp(prefix="bench-monitoring-"))
    temporal = iris_ctl = proxy = None
    workers: list[BenchWorker] = []
    try:
        temporal = start_temporal_dev_server(state / "temporal", ui=False)
        iris_ctl = start_iris_controller(state / "iris")
        proxy = CountingProxy(iris_ctl.url)
        client = await Client.connect(temporal.address, data_converter=pydantic_data_converter)
        iris = IrisClient(iris_ctl.url, client_revision_date=datetime.date.today().isoformat())
        policy = PolicySettings()
        sc = hist = res = rej = None
        if args.sizes:
            tq, cluster = "bench-scale", "bench-scale"
            w = BenchWorker(temporal.address, tq, proxy.url, iris_ctl.url, cluster, policy, state / "work",
                            state / "worker-scale.log")
            w.args += ["--push-lead", str(args.push_lead)]
            w.start()
            workers.append(w)
            sc = await scale(args, client, iris, proxy, w, tq, cluster, iris_ctl.pid, temporal.process.pid)
            sc_hwm = proc_hwm_kib(w.pid)
            w.stop()
            print(f"scale worker VmHWM {sc_hwm and sc_hwm / 1024:.0f} MiB", file=sys.stderr)
        if "history" not in args.skip:
            c = args.compress
            fast = PolicySettings(watch_interval_s=policy.watch_interval_s / c,
                                  watch_progress_interval_s=policy.watch_progress_interval_s / c,
                                  watch_signal_progress_s=policy.watch_signal_progress_s / c,
                                  monitor_safety_interval_s=policy.monitor_safety_interval_s / c)
            tq = cluster = "bench-history"
            w = BenchWorker(temporal.address, tq, proxy.url, iris_ctl.url, cluster, fast, state / "work",
                            state / "worker-history.log")
            w.args += ["--marker-every", str(max(1, round(420 / c)))]
            workers.append(w.start())
            hist = await history(args, client, tq, cluster)
            w.stop()
        if "resume" not in args.skip:
            tq = cluster = "bench-resume"

            def make():
                w = BenchWorker(temporal.address, tq, proxy.url, iris_ctl.url, cluster, policy, state / "work",
                                state / "worker-resume.log")
                workers.append(w)
                return w
            res = await resume(args, client, make, tq, cluster, iris)
        if "reject" not in args.skip:
            rej = reject(args, temporal.address, state)
        await iris.aclose()
        print_tables(args, policy, sc, hist, res, rej)
        return 0
    finally:
        for w in workers:
            w.stop()
        if proxy:
            proxy.stop()
        if iris_ctl:
            iris_ctl.stop()
        if temporal:
            temporal.stop()
        shutil.rmtree(state, ignore_errors=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", default="1,10,50,100,200", help="concurrent running jobs per step ('' to skip)")
    ap.add_argument("--lead", type=float, default=100.0, help="seconds from start to the first job's end ...")
    ap.add_argument("--lead-per-job", type=float, default=0.25, help="... plus this per job (submission time)")
    ap.add_argument("--spread", type=float, default=20.0, help="job ends are spread over this many seconds")
    ap.add_argument("--compress", type=float, default=20.0, help="history: divide every policy interval by this")
    ap.add_argument("--resume-rounds", type=int, default=3)
    ap.add_argument("--resume-job-s", type=float, default=45.0, help="resume: the job ends this long after start")
    ap.add_argument("--reject-rounds", type=int, default=3)
    ap.add_argument("--dump", default="", help="scale: write each step's requests and timelines to DIR/n<N>.json")
    ap.add_argument("--push-lead", type=float, default=0.0,
                    help="scale: jobs print their last two markers (final check, kaniko's push) this many seconds "
                         "before their end, as a real push does minutes before; 0: no final marker ever")
    ap.add_argument("--skip", default="", help="comma list of: history, resume, reject")
    ap.add_argument("--smoke", action="store_true", help="the smallest run that still prints every table, in seconds (tests/bench/test_bench_smoke.py): one job ending 15 s after its "
                    "start, history and resume skipped, one reject round")
    args = ap.parse_args()
    if args.smoke:
        args.sizes, args.lead, args.spread, args.skip, args.reject_rounds = "1", 15.0, 0.0, "history,resume", 1
    args.sizes = [int(x) for x in args.sizes.split(",") if x.strip()]
    args.skip = {x.strip() for x in args.skip.split(",") if x.strip()}
    sys.exit(asyncio.run(main_async(args)))


if __name__ == "__main__":
    main()
