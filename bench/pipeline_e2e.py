"""Benchmark: full sandbox builds end to end, with where the time, history and memory go.

Starts a SandboxStack and a worker *process* (so its peak RSS and CPU are its own), then for each run
acts as the operator like ``sandbox/demo.py``: ``starter.py build``, make the package public when the
visibility gate asks (then signal ``recheck``), mark CI green and authorize the merge. Stage times come
from Temporal history (activity scheduled → closed, server clock), so polling does not blur them.

Prints Markdown tables; asserts nothing.
Run: .venv/bin/python bench/pipeline_e2e.py [--n 1] [--arch amd64 [--arch arm64]] [--timeout 900]
"""

from __future__ import annotations

import argparse
import asyncio
import atexit
import os
import resource
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from temporalio.api.common.v1 import Payload  # noqa: E402
from temporalio.api.enums.v1 import EventType  # noqa: E402
from temporalio.client import Client, WorkflowExecutionStatus, WorkflowUpdateFailedError  # noqa: E402
from temporalio.contrib.pydantic import pydantic_data_converter  # noqa: E402
from temporalio.service import RPCError  # noqa: E402

from activities.watch import watcher_view  # noqa: E402
from bench._stack import add_stack_flag, bench_stack  # noqa: E402
from clients.iris import IrisClient  # noqa: E402
from domain.config import load_config  # noqa: E402
from domain.models import MergeAuthorization, PipelineReport, target_workflow_id  # noqa: E402
from domain.watch import watcher_id  # noqa: E402
from runtime.operator_client import has_workers  # noqa: E402
from sandbox.git_remotes import commit_to_remote  # noqa: E402
from sandbox.stack import MARINSKYRL_SLUG, SandboxStack  # noqa: E402
from workflows.pipeline import BuildPipelineWorkflow  # noqa: E402
from workflows.target import TargetBuildWorkflow  # noqa: E402

PY = sys.executable
CLK_TCK = os.sysconf("SC_CLK_TCK")
_CLOSED = {EventType.EVENT_TYPE_ACTIVITY_TASK_COMPLETED, EventType.EVENT_TYPE_ACTIVITY_TASK_FAILED,
           EventType.EVENT_TYPE_ACTIVITY_TASK_TIMED_OUT, EventType.EVENT_TYPE_ACTIVITY_TASK_CANCELED}


# ------------------------------------------------------------------------------ processes
def proc_cpu_s(pid: int) -> float:
    """utime+stime of ``pid`` plus its reaped children, in seconds (0 when it is gone)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return 0.0
    fields = stat.rsplit(")", 1)[1].split()
    return sum(int(x) for x in fields[11:15]) / CLK_TCK  # utime stime cutime cstime


def proc_hwm_kib(pid: int) -> int | None:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1])
    except OSError:
        return None
    return None


class WorkerProcess:
    """``python worker.py`` in its own process group; ``stop()`` is idempotent and registered with atexit."""

    def __init__(self, config: Path, log: Path):
        self.proc = subprocess.Popen([PY, str(ROOT / "worker.py"), "--config", str(config)], cwd=ROOT,
                                     start_new_session=True, stdout=log.open("w"), stderr=subprocess.STDOUT)
        self.pid = self.proc.pid
        atexit.register(self.stop)

    def stop(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(self.pid, signal.SIGKILL)
                self.proc.wait()
        atexit.unregister(self.stop)


# ------------------------------------------------------------------------------ history analysis
@dataclass
class ActivitySpan:
    first_scheduled: float
    last_closed: float
    busy_s: float  # sum of scheduled → closed over every attempt of this activity type
    count: int

    @property
    def span_s(self) -> float:
        return self.last_closed - self.first_scheduled


@dataclass
class HistoryStats:
    workflow_id: str
    events: int
    bytes: int
    largest_payload: int
    largest_payload_where: str
    started: float
    closed: float | None
    activities: dict[str, ActivitySpan] = field(default_factory=dict)
    signals: dict[str, int] = field(default_factory=dict)  # signal name -> times received


def _payload_sizes(msg, where: str = ""):
    """Every Payload inside a protobuf message, with a dotted path (maps and repeated fields included)."""
    if isinstance(msg, Payload):
        yield msg.ByteSize(), where
        return
    for fd, value in msg.ListFields():
        if fd.message_type is None:
            continue
        name = f"{where}.{fd.name}" if where else fd.name
        if fd.message_type.GetOptions().map_entry:
            for k, v in value.items():
                if hasattr(v, "ListFields"):
                    yield from _payload_sizes(v, f"{name}[{k}]")
        elif hasattr(value, "ListFields"):
            yield from _payload_sizes(value, name)
        else:  # a repeated message field
            for i, v in enumerate(value):
                yield from _payload_sizes(v, f"{name}[{i}]")


def analyse(workflow_id: str, history) -> HistoryStats:
    events = list(history.events)
    scheduled: dict[int, tuple[str, float]] = {}
    spans: dict[str, ActivitySpan] = {}
    signals: dict[str, int] = {}
    largest, where = 0, "-"
    closed = None
    for ev in events:
        t = ev.event_time.ToMicroseconds() / 1e6
        for size, path in _payload_sizes(ev):
            if size > largest:
                kind = EventType.Name(ev.event_type).removeprefix("EVENT_TYPE_").lower()
                where = f"{kind}: {path.split('.', 1)[-1]}"
                largest = size
        if ev.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED:
            scheduled[ev.event_id] = (ev.activity_task_scheduled_event_attributes.activity_type.name, t)
        elif ev.event_type in _CLOSED:
            attrs = getattr(ev, ev.WhichOneof("attributes"))
            name, t0 = scheduled[attrs.scheduled_event_id]
            s = spans.get(name)
            if s is None:
                spans[name] = ActivitySpan(t0, t, t - t0, 1)
            else:
                s.first_scheduled, s.last_closed = min(s.first_scheduled, t0), max(s.last_closed, t)
                s.busy_s += t - t0
                s.count += 1
        elif ev.event_type == EventType.EVENT_TYPE_WORKFLOW_EXECUTION_SIGNALED:
            name = ev.workflow_execution_signaled_event_attributes.signal_name
            signals[name] = signals.get(name, 0) + 1
        elif ev.event_type == EventType.EVENT_TYPE_WORKFLOW_EXECUTION_UPDATE_ACCEPTED:  # counted with the signals
            name = ev.workflow_execution_update_accepted_event_attributes.accepted_request.input.name
            signals[name] = signals.get(name, 0) + 1
        elif ev.event_type in (EventType.EVENT_TYPE_WORKFLOW_EXECUTION_COMPLETED,
                               EventType.EVENT_TYPE_WORKFLOW_EXECUTION_FAILED,
                               EventType.EVENT_TYPE_WORKFLOW_EXECUTION_TERMINATED,
                               EventType.EVENT_TYPE_WORKFLOW_EXECUTION_CANCELED,
                               EventType.EVENT_TYPE_WORKFLOW_EXECUTION_TIMED_OUT):
            closed = t
    return HistoryStats(workflow_id=workflow_id, events=len(events), bytes=sum(e.ByteSize() for e in events),
                        largest_payload=largest, largest_payload_where=where,
                        started=events[0].event_time.ToMicroseconds() / 1e6, closed=closed, activities=spans,
                        signals=signals)


# ------------------------------------------------------------------------------ one build
@dataclass
class RunResult:
    run: int
    workflow_id: str
    status: str
    wall_s: float
    report: PipelineReport | None
    pipeline: HistoryStats | None = None
    targets: dict[str, HistoryStats] = field(default_factory=dict)
    iris_s: dict[str, str] = field(default_factory=dict)
    watcher_polls: dict[str, int] = field(default_factory=dict)  # cluster -> GetJobState polls during the run


STARTER_ABORTS: list[str] = []


def _starter(config: Path, *args: str) -> subprocess.CompletedProcess:
    out = subprocess.run([PY, str(ROOT / "starter.py"), "--config", str(config), *args], cwd=ROOT,
                         capture_output=True, text=True, timeout=600)
    if out.returncode == -signal.SIGABRT and "Fatal Python error" in out.stderr and out.stdout.strip():
        # starter.py can abort in interpreter finalization *after* doing its work (Temporal core thread
        # vs. PyGILState_Release); count it and carry on, the command's effect is already done.
        STARTER_ABORTS.append(args[0])
        return out
    if out.returncode != 0:
        raise SystemExit(f"starter.py {args[0]} exited {out.returncode}:\n{out.stdout}\n{out.stderr[-3000:]}")
    return out


async def _operate(stack: SandboxStack, client: Client, wid: str, keys: list[str], give_up_s: float) -> str:
    """Play the two human roles until the pipeline closes; return its final report status."""
    handle = client.get_workflow_handle(wid)
    deadline = time.monotonic() + give_up_s
    rechecked: set[str] = set()
    approved = False  # approve once: a later approve_merge in flight when the build merges and closes is aborted
    while time.monotonic() < deadline:
        if (await handle.describe()).status != WorkflowExecutionStatus.RUNNING:
            break
        for key in keys:
            try:
                st = await client.get_workflow_handle(target_workflow_id(wid, key)).query(TargetBuildWorkflow.status)
            except Exception:  # noqa: BLE001 - the target has not started yet
                continue
            if st.waiting and st.waiting.kind == "package_visibility" and key not in rechecked:
                # Every waiting target gets its own recheck; else it sits out its own re-check timer.
                stack.token_registry.set_public(stack.image_repo_path, True)
                await client.get_workflow_handle(target_workflow_id(wid, key)).signal(TargetBuildWorkflow.recheck)
                rechecked.add(key)
        try:
            rep = await handle.query(BuildPipelineWorkflow.report)
        except Exception:  # noqa: BLE001 - first workflow task not processed yet
            rep = None
        if rep and rep.status == "awaiting_merge" and rep.pull_request and not approved:
            stack.github.set_check(MARINSKYRL_SLUG, rep.pull_request.head_sha, "ci")
            try:
                await handle.execute_update(BuildPipelineWorkflow.approve_merge, MergeAuthorization(by="bench-operator"))
                approved = True
            except WorkflowUpdateFailedError:
                pass  # not accepted yet (nothing to merge yet); ask again next round
            except RPCError:
                if (await handle.describe()).status == WorkflowExecutionStatus.RUNNING:
                    raise
                break  # the build closed while the approval was on its way: its report says how
        await asyncio.sleep(1.0)
    try:
        return (await handle.query(BuildPipelineWorkflow.report)).status
    except Exception:  # noqa: BLE001
        return "unknown"


async def run_one(i: int, stack: SandboxStack, client: Client, archs: list[str], give_up_s: float) -> RunResult:
    commit_to_remote(stack.remotes.marinskyrl_url, {"bench/run.txt": f"bench run {i} at {time.time()}\n"},
                     f"bench: run {i}")  # a fresh source commit, so each run is a new pipeline id
    stack.token_registry.set_public(stack.image_repo_path, False)  # each run passes the same visibility gate
    t0 = time.monotonic()
    out = _starter(stack.config_path, "build", *[f"--arch={a}" for a in archs], "--variant=standard",
                   *[f"--cluster={a}=sandbox-{a}" for a in archs], "--requested-by", "bench",
                   "--reason", "pipeline benchmark")
    wid = next(line.split()[1] for line in out.stdout.splitlines() if line.startswith("workflow:"))
    keys = [f"{a}-standard" for a in archs]
    status = await _operate(stack, client, wid, keys, give_up_s)
    res = RunResult(run=i, workflow_id=wid, status=status, wall_s=time.monotonic() - t0, report=None)
    try:
        res.report = await client.get_workflow_handle(wid).query(BuildPipelineWorkflow.report)
    except Exception:  # noqa: BLE001
        pass
    res.pipeline = analyse(wid, await client.get_workflow_handle(wid).fetch_history())
    for key in keys:
        try:
            res.targets[key] = analyse(target_workflow_id(wid, key), await client.get_workflow_handle(target_workflow_id(wid, key)).fetch_history())
        except Exception:  # noqa: BLE001 - the target never started
            pass
    config = load_config(stack.config_path)
    for cluster in {t.cluster for t in (res.report.targets if res.report else [])}:
        res.watcher_polls[cluster] = await watcher_polls(client, cluster, config.temporal.task_queue,
                                                         since=res.pipeline.started)
    for t in res.report.targets if res.report else []:
        async with IrisClient(stack.iris.url, client_revision_date=config.clusters[t.cluster].client_revision_date,
                              cluster_name=t.cluster) as iris:
            spans = []
            for job_id in t.job_ids:
                j = await iris.job_status(job_id, with_tasks=False)
                if j.started_at_ms and j.finished_at_ms:
                    spans.append(f"{(j.finished_at_ms - j.started_at_ms) / 1000:.1f}")
            res.iris_s[t.key] = " + ".join(spans) or "-"
    return res


async def watcher_polls(client: Client, cluster: str, tq: str, *, since: float) -> int:
    """Polls the cluster's watcher made (every run since ``since``): completed activities report them in
    their result, a running one in its heartbeat details."""
    total = 0
    try:
        async for wf in client.list_workflows(f"WorkflowId = '{watcher_id(cluster, tq)}'"):
            h = client.get_workflow_handle(wf.id, run_id=wf.run_id)
            for ev in (await h.fetch_history()).events:
                if ev.event_time.ToMicroseconds() / 1e6 < since:
                    continue
                if ev.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_COMPLETED:
                    (res,) = await client.data_converter.decode(ev.activity_task_completed_event_attributes.result.payloads)
                    total += int((res or {}).get("polls", 0))
            view = await watcher_view(client, cluster, tq) if wf.status == WorkflowExecutionStatus.RUNNING else None
            total += int((view or {}).get("polls", 0))
    except Exception:  # noqa: BLE001 - visibility not ready: unknown, not zero
        return -1
    return total


# ------------------------------------------------------------------------------ tables
def _fmt(v: float | None) -> str:
    return "-" if v is None else f"{v:.1f}"


def _span(h: HistoryStats | None, name: str) -> float | None:
    s = h.activities.get(name) if h else None
    return s.span_s if s else None


def stage_rows(r: RunResult, key: str) -> dict[str, str]:
    p, t = r.pipeline, r.targets.get(key)
    rows = {"load (load_build_state)": _fmt(_span(p, "load_build_state")),
            "prepare (prepare_source)": _fmt(_span(p, "prepare_source")),
            "plan (plan_targets)": _fmt(_span(p, "plan_targets"))}
    sub, chk = (t.activities.get("submit_job"), t.activities.get("check_build_log")) if t else (None, None)
    rows["submit → acting on the terminal state (submit_job … check_build_log)"] = _fmt(
        chk.first_scheduled - sub.first_scheduled if sub and chk else None)
    cluster = next((x.cluster for x in (r.report.targets if r.report else []) if x.key == key), None)
    polls = r.watcher_polls.get(cluster) if cluster else None
    rows["  Iris polls by the cluster watcher (one GetJobState each, all targets)"] = "-" if polls is None else str(polls)
    rows["  target wake-ups (job_changed signals, wake updates)"] = (
        str(t.signals.get("job_changed", 0) + t.signals.get("wake", 0)) if t else "-")
    rows["  target monitoring activities (watch_job)"] = str(t.activities["watch_job"].count) if t and "watch_job" in t.activities else "0"
    rows["log check (check_build_log)"] = _fmt(_span(t, "check_build_log"))
    val = t.activities.get("validate_image") if t else None
    rows["validation (validate_image, activity time)"] = _fmt(val.busy_s if val else None)
    rows["  visibility gate wait (operator)"] = _fmt(val.span_s - val.busy_s if val else None)
    rows["record (record_artifact)"] = _fmt(_span(p, "record_artifact"))
    rec, mer = (p.activities.get("record_artifact"), p.activities.get("merge_pull_request")) if p else (None, None)
    rows["  awaiting merge (CI + approval)"] = _fmt(mer.first_scheduled - rec.last_closed if rec and mer else None)
    rows["merge (merge_pull_request)"] = _fmt(_span(p, "merge_pull_request"))
    rows["total (pipeline start → close, server)"] = _fmt(p.closed - p.started if p and p.closed else None)
    rows["total (operator wall clock, incl. starter)"] = _fmt(r.wall_s)
    rows["Iris job duration (started → finished)"] = r.iris_s.get(key, "-")
    rows["status"] = r.status
    return rows


def print_tables(results: list[RunResult], archs: list[str], cpu: dict[str, float], rss_kib: int | None,
                 n_workflows_note: str) -> None:
    cols = [(r, f"{a}-standard") for r in results for a in archs]
    table = {f"run {r.run} {k}": stage_rows(r, k) for r, k in cols}
    names = list(next(iter(table.values())))
    print("\n### Stage wall time (s)\n")
    print("| stage | " + " | ".join(table) + " |")
    print("|---|" + "---|" * len(table))
    for n in names:
        print(f"| {n} | " + " | ".join(table[c][n] for c in table) + " |")

    print("\n### Temporal history per workflow\n")
    print("| workflow | events | history bytes | largest payload (bytes) | in event |")
    print("|---|---|---|---|---|")
    for r in results:
        for h in [r.pipeline, *r.targets.values()]:
            if h:
                print(f"| `{h.workflow_id}` | {h.events} | {h.bytes:,} | {h.largest_payload:,} | "
                      f"{h.largest_payload_where} |")

    print(f"\n### Resources ({n_workflows_note})\n")
    print("| process | CPU s (incl. reaped children) | peak RSS (VmHWM) |")
    print("|---|---|---|")
    for name, s in cpu.items():
        rss = f"{rss_kib / 1024:.0f} MiB" if name == "worker" and rss_kib else "-"
        print(f"| {name} | {s:.1f} | {rss} |")


# ------------------------------------------------------------------------------ main
async def main_async(args) -> int:
    state_dir = Path(args.state_dir) if args.state_dir else Path(tempfile.mkdtemp(prefix="bench-pipeline-"))
    stack = bench_stack(args.stack, state_dir, "pipeline")
    worker = None
    try:
        worker = WorkerProcess(stack.config_path, state_dir / "worker.log")
        procs = {"worker": worker.pid, "temporal dev server": stack.temporal.pid, "iris controller": stack.iris.pid,
                 "registry (token)": stack.token_registry.pid, "registry (open)": stack.open_registry.pid,
                 "github stand-in": getattr(stack.github, "pid", None)}
        if stack.shared:  # other benches use the attached stack's services too: their CPU is not this run's
            procs = {"worker": worker.pid}
        procs = {k: v for k, v in procs.items() if v}
        cpu0 = {k: proc_cpu_s(pid) for k, pid in procs.items()}
        self0 = resource.getrusage(resource.RUSAGE_SELF)
        client = await Client.connect(stack.temporal.address, namespace=stack.temporal.namespace,
                                      data_converter=pydantic_data_converter)
        # The worker polls before the first build (a loaded machine took over a minute to start it, and
        # starter.py refuses a build no worker polls for).
        config = load_config(stack.config_path)
        deadline = time.monotonic() + 300
        while not await has_workers(client, config.temporal.task_queue):
            if time.monotonic() > deadline:
                raise SystemExit("the worker did not poll within 300 s (see its log)")
            await asyncio.sleep(0.5)
        results = []
        for i in range(1, args.n + 1):
            print(f"run {i}/{args.n}: building {', '.join(args.arch)} …", file=sys.stderr, flush=True)
            results.append(await run_one(i, stack, client, args.arch, args.timeout))
            r = results[-1]
            print(f"run {i}: {r.status} in {r.wall_s:.1f}s", file=sys.stderr, flush=True)
            if r.report and r.status != "merged":
                print(f"run {i} message: {r.report.message}", file=sys.stderr, flush=True)
        rss = proc_hwm_kib(worker.pid)
        cpu = {k: proc_cpu_s(pid) - cpu0[k] for k, pid in procs.items()}
        self1 = resource.getrusage(resource.RUSAGE_SELF)
        cpu["bench (operator + starter children)"] = (self1.ru_utime + self1.ru_stime - self0.ru_utime - self0.ru_stime
                                                      + _children_cpu())
        print_tables(results, args.arch, cpu, rss, f"{args.n} run(s), deltas over the runs"
                     + ("; the services of the attached --stack are shared, not shown" if stack.shared else ""))
        if STARTER_ABORTS:
            print(f"\nnote: starter.py aborted (SIGABRT) at interpreter exit after completing its work "
                  f"{len(STARTER_ABORTS)} time(s): {', '.join(STARTER_ABORTS)}")
        return 0 if all(r.status == "merged" for r in results) else 1
    finally:
        if worker is not None:
            worker.stop()
        stack.stop()
        if not args.state_dir and not args.keep_state:
            shutil.rmtree(state_dir, ignore_errors=True)


def _children_cpu() -> float:
    c = resource.getrusage(resource.RUSAGE_CHILDREN)
    return c.ru_utime + c.ru_stime  # starter.py subprocesses (worker is still running, so not counted)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=1, help="number of builds, one after another")
    ap.add_argument("--arch", action="append", choices=["amd64", "arm64"], help="repeatable (default: amd64)")
    ap.add_argument("--timeout", type=float, default=900, help="give up on one build after this many seconds")
    ap.add_argument("--state-dir", help="keep the stack's state here (default: a temporary directory, removed)")
    ap.add_argument("--keep-state", action="store_true", help="do not remove the temporary state directory")
    add_stack_flag(ap)
    ap.add_argument("--smoke", action="store_true", help="the smallest run that still prints every table, in seconds (tests/bench/test_bench_smoke.py): one amd64 build")
    args = ap.parse_args()
    if args.smoke:
        args.n, args.arch, args.timeout = 1, ["amd64"], 300
    args.arch = args.arch or ["amd64"]
    sys.exit(asyncio.run(main_async(args)))


if __name__ == "__main__":
    main()
