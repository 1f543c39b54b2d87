"""Benchmark: the per-cluster watcher at 1,000 and 5,000 watched jobs, a burst of 200 job ends, and
detection at 1–200 jobs on the production cadence.

A Temporal dev server and an in-process worker running the real IrisWatcherWorkflow and watch_cluster
activity; the Iris side is the stand-in job list of tests/iris/standin_jobs.py (what the watcher asks is
counted there), so thousands of jobs cost no controller. Targets are tiny receiver workflows that record
the watcher's wake-up (the ``wake`` update for an end, the ``job_changed`` signal). Every payload crossing
Temporal is measured by a pass-through codec.

1. scale: register N watches (one build contract of 31 marker texts, like the real one; registered the way
   ``watch_job`` does: the texts in the first registration, the key in every other), until the current run
   holds them all; largest payload, continue-as-new runs, heartbeat size, status requests per minute, the
   watcher's workflow tasks (longest started → completed, most signals in one, failed or timed out) and
   the longest stall of the worker's event loop (which also runs the 2 s deadlock timers);
2. burst: 200 of the watched jobs end in the same second: end → the target's signal (server clock),
   p50/p95/max, and the status requests it took;
3. detection: N ∈ {1, 10, 100, 200} jobs ending at random times over ``--spread`` s, production policy
   (evenly spaced polls within at most 12 status requests in any sliding minute): end → signal p50/p95, and
   the most status requests in any 60 s.

Prints Markdown tables; asserts nothing. Run: .venv/bin/python bench/watcher_scale.py [--sizes 1000,5000]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import datetime
import random
import resource
import shutil
import sys
import tempfile
import time
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from temporalio.api.enums.v1 import EventType  # noqa: E402
from temporalio.client import Client  # noqa: E402
from temporalio.contrib.pydantic import pydantic_data_converter  # noqa: E402
from temporalio.service import RPCError  # noqa: E402
from temporalio.worker import Worker  # noqa: E402

from activities.watch import REGISTER_BATCH, WatchActivities, watcher_view  # noqa: E402
from domain.config import PolicySettings, ServiceConfig  # noqa: E402
from domain.models import JobProgress  # noqa: E402
from domain.watch import PageRequest, WatcherInput, WatchPage, WatchRequest, marker_set_key, watcher_id  # noqa: E402
from sandbox.temporal_server import start_temporal_dev_server  # noqa: E402
from tests.iris.standin_jobs import StandinJobs  # noqa: E402
from tests.workflows.receiver import EndReceiver, SizeRecorder  # noqa: E402
from tests.workflows.test_watcher_scale import MARKERS  # noqa: E402
from workflows.watcher import IrisWatcherWorkflow  # noqa: E402

STATUS = ("GetJobState", "GetJobStatus", "ListJobs")


def pct(values: list[float], q: float) -> float | None:
    if not values:
        return None
    v = sorted(values)
    return v[min(len(v) - 1, max(0, round(q / 100 * len(v) + 0.5) - 1))]


def fmt(v, nd=1) -> str:
    return "-" if v is None else f"{v:.{nd}f}"


def config(work: Path, cluster: str, policy: PolicySettings) -> ServiceConfig:
    return ServiceConfig.model_validate({
        "work_dir": str(work),
        "repos": {"marinskyrl_url": "file:///nowhere", "harbor_url": "file:///nowhere"},
        "clusters": {cluster: {"controller_url": "https://standin.invalid",
                               "client_revision_date": datetime.date.today().isoformat()}},
        "registry": {"image_repository": "127.0.0.1:5000/gpu-rl", "user": {"kind": "literal_public", "value": "u"}, "token": {"kind": "env", "name": "X"}},
        "policy": policy.model_dump(),
    })



WOKEN = (EventType.EVENT_TYPE_WORKFLOW_EXECUTION_SIGNALED, EventType.EVENT_TYPE_WORKFLOW_EXECUTION_UPDATE_ACCEPTED)


def woken_at(events) -> float:
    """When a receiver had its wake-up (epoch s): the signal event, or the ``wake`` update accepted (the watcher
    sends an end as the update since issue 37; accepted = written with the receiver's task)."""
    return next(e.event_time.ToMicroseconds() / 1e6 for e in events if e.event_type in WOKEN)

class Bench:
    def __init__(self, client: Client, sizes: SizeRecorder, work: Path):
        self.client, self.sizes, self.work = client, sizes, work

    async def register(self, wid: str, tq: str, cluster: str, reqs: list[WatchRequest]) -> float:
        """As workers register since issue 37: ``watch_many`` signals of up to REGISTER_BATCH registrations
        (activities/watch.py _Registrations), several workers' batches at once."""
        t = time.monotonic()
        await self.client.start_workflow(IrisWatcherWorkflow.run, WatcherInput(cluster=cluster), id=wid,
                                         task_queue=tq, start_signal="watch", start_signal_args=[reqs[0]])
        sem = asyncio.Semaphore(4)

        async def one(batch):
            async with sem:
                await self.client.get_workflow_handle(wid).signal("watch_many", batch)
        rest = reqs[1:]
        await asyncio.gather(*(one(rest[i:i + REGISTER_BATCH]) for i in range(0, len(rest), REGISTER_BATCH)))
        return time.monotonic() - t

    async def held(self, wid: str, n: int, within_s: float = 900) -> WatchPage | None:
        deadline = time.monotonic() + within_s
        while time.monotonic() < deadline:
            try:
                page = await self.client.get_workflow_handle(wid).query("changes", PageRequest(),
                                                                       result_type=WatchPage)
            except RPCError as e:  # a loaded machine: a query times out while a large task runs
                print(f"{wid}: changes query failed ({e.message}); asking again", file=sys.stderr, flush=True)
                await asyncio.sleep(1.0)
                continue
            if page.watched >= n and not page.adopting:
                return page
            await asyncio.sleep(1.0)
        return None

    async def runs(self, wid: str) -> int:
        return len([w async for w in self.client.list_workflows(f"WorkflowId = '{wid}'")])

    async def tasks(self, wid: str) -> dict:
        """The watcher's workflow tasks over all its runs: the longest (started → completed, server clock,
        i.e. the activation and its completion), the most signals delivered in one, failures and timeouts
        (a deadlock-detected activation fails its task)."""
        longest, most, failed, count, why = 0.0, 0, 0, 0, set()
        async for w in self.client.list_workflows(f"WorkflowId = '{wid}'"):
            signals, started_at = 0, None
            async for e in self.client.get_workflow_handle(wid, run_id=w.run_id).fetch_history_events():
                t = e.event_type
                if t == EventType.EVENT_TYPE_WORKFLOW_EXECUTION_SIGNALED:
                    signals += 1
                elif t == EventType.EVENT_TYPE_WORKFLOW_TASK_STARTED:
                    most, signals, started_at, count = max(most, signals), 0, e.event_time.ToMicroseconds(), count + 1
                elif t == EventType.EVENT_TYPE_WORKFLOW_TASK_COMPLETED and started_at is not None:
                    longest = max(longest, (e.event_time.ToMicroseconds() - started_at) / 1e3)
                elif t == EventType.EVENT_TYPE_WORKFLOW_TASK_FAILED:
                    failed += 1
                    a = e.workflow_task_failed_event_attributes
                    why.add(f"{a.cause}: {a.failure.message[:120]}")
                elif t == EventType.EVENT_TYPE_WORKFLOW_TASK_TIMED_OUT:
                    failed += 1
                    why.add("timed out")
        if why:
            print(f"{wid}: failed workflow tasks: {sorted(why)}", file=sys.stderr, flush=True)
        return {"wft_max_ms": longest, "wft_max_signals": most, "wft_failed": failed, "wft": count}


class LoopLag:
    """The longest time the event loop did not get to a 50 ms timer (its overshoot)."""

    def __init__(self) -> None:
        self.max_s = 0.0
        self._task: asyncio.Task | None = None

    async def _run(self) -> None:
        while True:
            t = time.monotonic()
            await asyncio.sleep(0.05)
            self.max_s = max(self.max_s, time.monotonic() - t - 0.05)

    def start(self) -> None:
        self.max_s = 0.0
        self._task = asyncio.create_task(self._run())

    def stop(self) -> float:
        if self._task:
            self._task.cancel()
        return self.max_s


def most_in_a_minute(iris: StandinJobs, since: float) -> int:
    """The most status requests in any sliding 60 s since ``since`` (the loop's clock): the budget is a cap
    per sliding minute, not an average."""
    times = sorted(t for m, _, t in iris.calls if m in STATUS and t > since - 60.0)  # windows ending after since
    j, most = 0, 0
    for i, t in enumerate(times):
        while times[j] <= t - 60.0:
            j += 1
        if t >= since:
            most = max(most, i - j + 1)
    return most


def requests(iris: StandinJobs) -> dict[str, int]:
    return {m: iris.requests[m] for m in (*STATUS, "FetchLogs", "FetchLogs(feed)")}


def push(iris: StandinJobs, job_ids) -> None:
    """The build's last two text markers (its final check and kaniko's push), as a real build prints them
    a while before it ends: what the watcher's near-the-end cadence keys on."""
    for j in job_ids:
        iris.log(j, MARKERS[-2])
        iris.log(j, MARKERS[-1])


async def scale(b: Bench, n: int, burst: int, bursts: int = 1, push_lead: float = 0.0,
                steady: float = 60.0, burst_spread: float = 0.0, audit_lag: float | None = None
                ) -> tuple[dict, dict | None]:
    run = uuid.uuid4().hex[:6]
    cluster, tq = f"scale-{run}", f"bench-scale-{run}"
    policy = PolicySettings()
    ids = [f"/runner/gpu-rl-{run}-{i:05d}-amd64-standard-r0" for i in range(n)]
    iris = StandinJobs({j: "running" for j in ids}, audit_lag_s=audit_lag)
    ends = burst * bursts
    receivers = {ids[i * (n // ends)]: f"recv-{run}-{i}" for i in range(ends)} if burst else {}
    key = marker_set_key(MARKERS)
    reqs = [WatchRequest(job_id=j, workflow_id=receivers.get(j, f"gone-{run}-{i}"), markers=[] if i else MARKERS,
                         marker_set=key, registered_at="2026-12-01T00:00:00+00:00",
                         known=JobProgress(job_id=j, state="running", terminal=False))
            for i, j in enumerate(ids)]
    wid = watcher_id(cluster, tq)
    b.sizes.largest = 0
    lag = LoopLag()
    watch = WatchActivities(config(b.work, cluster, policy), transport=iris)
    async with Worker(b.client, task_queue=tq, workflows=[IrisWatcherWorkflow, EndReceiver],
                      activities=[watch.watch_cluster], max_concurrent_activities=20):
        for r in receivers.values():
            await b.client.start_workflow(EndReceiver.run, id=r, task_queue=tq)
        lag.start()
        reg_s = await b.register(wid, tq, cluster, reqs)
        t = time.monotonic()
        page = await b.held(wid, n)
        held_s = time.monotonic() - t
        register_lag_s = lag.stop()
        # Steady: --steady s (60) of polling with nothing changing.
        before, t0, loop0 = requests(iris), time.monotonic(), asyncio.get_running_loop().time()
        await asyncio.sleep(steady)
        after, minutes = requests(iris), (time.monotonic() - t0) / 60
        view = await watcher_view(b.client, cluster, tq)
        hb = len(str(view)) if view else None
        row = {"n": n, "register_s": reg_s, "held_s": held_s, "runs": await b.runs(wid),
               "largest_kb": b.sizes.largest / 1024, "page_watches": len(page.watches) if page else None,
               "heartbeat_b": hb, "status_per_min": sum(after[m] - before[m] for m in STATUS) / minutes,
               "most_per_min": most_in_a_minute(iris, loop0),
               "rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, "lag_s": register_lag_s,
               **await b.tasks(wid)}
        burst_row = None
        if burst:
            lag.start()
            before, loop0 = requests(iris), asyncio.get_running_loop().time()
            lat = []
            rng = random.Random(n)
            items = list(receivers.items())
            per_burst = []
            for k in range(bursts):  # each burst at a random phase of the poll cadence
                if k:
                    await asyncio.sleep(rng.uniform(0, 2 * policy.watch_interval_s))
                group = items[k::bursts]
                if push_lead:
                    push(iris, [j for j, _ in group])
                    await asyncio.sleep(push_lead)
                ended: dict[str, float] = {}
                start = time.time()
                # --burst-spread: each job ends at a random moment of the spread, else all in the same second
                # (each end's own time is what its detection is measured from).
                for at, j in sorted((rng.uniform(0, burst_spread) if burst_spread else 0.0, j) for j, _ in group):
                    await asyncio.sleep(max(0.0, start + at - time.time()))
                    iris.set_state(j, "succeeded" if push_lead else "failed")  # failed: an end without warning
                    ended[j] = time.time()
                mine = []
                for j, r in group:
                    h = b.client.get_workflow_handle(r)
                    await asyncio.wait_for(h.result(), 300)
                    mine.append(woken_at((await h.fetch_history()).events) - ended[j])
                lat += mine
                per_burst.append(f"{min(mine):.2f}-{max(mine):.2f}")
            print(f"N={n}: end → signalled per burst (min-max s): {', '.join(per_burst)}", file=sys.stderr, flush=True)
            after = requests(iris)
            ends_label = f"{burst} × {bursts}" if bursts > 1 else str(burst)
            burst_row = {"n": n, "ends": ends_label + (f" over {burst_spread:g} s" if burst_spread else ""),
                         "p50": pct(lat, 50), "p95": pct(lat, 95), "max": max(lat),
                         "status_requests": sum(after[m] - before[m] for m in STATUS),
                         "by_method": {m: after[m] - before[m] for m in (*STATUS, "FetchLogs(feed)") if after[m] - before[m]},
                         "most_per_min": most_in_a_minute(iris, loop0),
                         "largest_kb": b.sizes.largest / 1024, "lag_s": lag.stop()}
        await b.client.get_workflow_handle(wid).terminate("bench over")
    return row, burst_row


async def detection(b: Bench, n: int, spread: float, push_lead: float = 0.0, settle: float = 10.0,
                    audit_lag: float | None = None) -> dict:
    run = uuid.uuid4().hex[:6]
    cluster, tq = f"det-{run}", f"bench-det-{run}"
    policy = PolicySettings()
    ids = [f"/runner/gpu-rl-{run}-{i:04d}-amd64-standard-r0" for i in range(n)]
    iris = StandinJobs({j: "running" for j in ids}, audit_lag_s=audit_lag)
    reqs = [WatchRequest(job_id=j, workflow_id=f"recv-{run}-{i}", markers=[] if i else MARKERS,
                         marker_set=marker_set_key(MARKERS), registered_at="2026-12-01T00:00:00+00:00",
                         known=JobProgress(job_id=j, state="running", terminal=False)) for i, j in enumerate(ids)]
    wid = watcher_id(cluster, tq)
    watch = WatchActivities(config(b.work, cluster, policy), transport=iris)
    async with Worker(b.client, task_queue=tq, workflows=[IrisWatcherWorkflow, EndReceiver],
                      activities=[watch.watch_cluster], max_concurrent_activities=20):
        for i in range(n):
            await b.client.start_workflow(EndReceiver.run, id=f"recv-{run}-{i}", task_queue=tq)
        await b.register(wid, tq, cluster, reqs)
        await b.held(wid, n)
        await asyncio.sleep(settle)
        before, t0, loop0 = requests(iris), time.monotonic(), asyncio.get_running_loop().time()
        rng = random.Random(n)
        ends = sorted((rng.uniform(0, spread), j) for j in ids)
        # --push-lead: each job prints its final markers that long before its end (one more event each).
        events = sorted([*((at + push_lead, "end", j) for at, j in ends),
                         *(((at, "push", j) for at, j in ends) if push_lead else ())])
        ended: dict[str, float] = {}
        start = time.time()
        for at, what, j in events:
            await asyncio.sleep(max(0.0, start + at - time.time()))
            if what == "push":
                push(iris, [j])
                continue
            iris.set_state(j, "succeeded")
            ended[j] = time.time()
        lat = []
        for i, j in enumerate(ids):
            h = b.client.get_workflow_handle(f"recv-{run}-{i}")
            await asyncio.wait_for(h.result(), 300)
            lat.append(woken_at((await h.fetch_history()).events) - ended[j])
        after, minutes = requests(iris), (time.monotonic() - t0) / 60
        with contextlib.suppress(Exception):  # the watcher ends by itself once nothing is left
            await b.client.get_workflow_handle(wid).terminate("bench over")
    return {"n": n, "p50": pct(lat, 50), "p95": pct(lat, 95), "max": max(lat),
            "status_per_min": sum(after[m] - before[m] for m in STATUS) / minutes,
            "most_per_min": most_in_a_minute(iris, loop0)}


async def main_async(args) -> int:
    state = Path(tempfile.mkdtemp(prefix="bench-watcher-"))
    temporal = None
    try:
        temporal = start_temporal_dev_server(state / "temporal", ui=False)
        sizes = SizeRecorder()
        client = await Client.connect(temporal.address, data_converter=dataclasses.replace(
            pydantic_data_converter, payload_codec=sizes))
        b = Bench(client, sizes, state / "work")
        scale_rows, burst_rows, det_rows = [], [], []
        for n in args.sizes:
            print(f"scale N={n}", file=sys.stderr, flush=True)
            row, burst = await scale(b, n, args.burst if n >= args.burst * args.bursts else 0, args.bursts,
                                     args.push_lead, args.steady, args.burst_spread, args.audit_lag)
            scale_rows.append(row)
            if burst:
                burst_rows.append(burst)
        for n in args.detect:
            print(f"detection N={n}", file=sys.stderr, flush=True)
            det_rows.append(await detection(b, n, args.spread, args.push_lead, min(10.0, args.steady), args.audit_lag))
        if scale_rows:
            print("\n### Watcher at scale (stand-in job list, real Temporal watcher)\n")
            print("| watched jobs | register s | held by the current run after s | runs (continue-as-new) | "
                  "largest payload KB | jobs in one query page | heartbeat bytes | status req/min (idle) | "
                  "most status req in any 60 s (idle) | "
                  "longest workflow task ms | most signals in one task | tasks failed | "
                  "longest event-loop stall s (registering) | bench process peak RSS MiB |")
            print("|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
            for r in scale_rows:
                print(f"| {r['n']} | {fmt(r['register_s'])} | {fmt(r['held_s'])} | {r['runs']} | "
                      f"{fmt(r['largest_kb'])} | {r['page_watches']} | {r['heartbeat_b']} | "
                      f"{fmt(r['status_per_min'])} | {r['most_per_min']} | {fmt(r['wft_max_ms'], 0)} | "
                      f"{r['wft_max_signals']} | "
                      f"{r['wft_failed']} of {r['wft']} | {fmt(r['lag_s'], 2)} | {fmt(r['rss_mib'], 0)} |")
        if burst_rows:
            lead = f"; final markers {args.push_lead:g} s before" if args.push_lead else "; no final markers"
            when = f"spread over {args.burst_spread:g} s" if args.burst_spread else "all in the same second"
            feed = (f"; the controller's audit feed stood in, lines readable {args.audit_lag:g} s after the change"
                    if args.audit_lag is not None else "; no audit feed (the stand-in writes no controller lines)")
            print(f"\n### A burst of job ends ({when}{lead}{feed})\n")
            print("| watched jobs | ends | end → target signalled p50 s | p95 s | max s | status requests | by method | "
                  "most status req in any 60 s | longest event-loop stall s |")
            print("|---:|---:|---:|---:|---:|---:|---|---:|---:|")
            for r in burst_rows:
                print(f"| {r['n']} | {r['ends']} | {fmt(r['p50'], 2)} | {fmt(r['p95'], 2)} | {fmt(r['max'], 2)} | "
                      f"{r['status_requests']} | {', '.join(f'{k} {v}' for k, v in r['by_method'].items())} | "
                      f"{r['most_per_min']} | {fmt(r['lag_s'], 2)} |")
        if det_rows:
            lead = f", final markers {args.push_lead:g} s before each" if args.push_lead else ", no final markers"
            print(f"\n### Detection on the production cadence (ends spread over {args.spread:g} s{lead})\n")
            print("| jobs | end → target signalled p50 s | p95 s | max s | status req/min | most in any 60 s |")
            print("|---:|---:|---:|---:|---:|---:|")
            for r in det_rows:
                print(f"| {r['n']} | {fmt(r['p50'], 2)} | {fmt(r['p95'], 2)} | {fmt(r['max'], 2)} | "
                      f"{fmt(r['status_per_min'])} | {r['most_per_min']} |")
        return 0
    finally:
        if temporal:
            temporal.stop()
        shutil.rmtree(state, ignore_errors=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", default="1000,5000", help="watched jobs per scale step ('' to skip)")
    ap.add_argument("--burst", type=int, default=200, help="jobs ending in the same second (at each scale step)")
    ap.add_argument("--bursts", type=int, default=1, help="bursts per scale step, each at a random poll phase")
    ap.add_argument("--detect", default="1,10,100,200", help="jobs per detection step ('' to skip)")
    ap.add_argument("--spread", type=float, default=60.0)
    ap.add_argument("--push-lead", type=float, default=0.0,
                    help="ending jobs print their build's final two markers this many seconds before the end "
                         "(as a real push does); 0: they end without them, like a failed build")
    ap.add_argument("--steady", type=float, default=60.0, help="seconds of idle polling measured at each scale step")
    ap.add_argument("--burst-spread", type=float, default=0.0,
                    help="the burst's jobs end at random moments over this many seconds (0: all in the same second)")
    ap.add_argument("--audit-lag", type=float, default=None,
                    help="the stand-in writes the controller's audit lines (domain/controller_feed.py), readable this "
                         "many seconds after each change (1.6: measured on the real local controller); unset: none")
    ap.add_argument("--smoke", action="store_true", help="the smallest run that still prints every table, in seconds (tests/bench/test_bench_smoke.py): 50 watched, a burst of 5, "
                    "5 s idle, detection of 2 jobs over 5 s")
    args = ap.parse_args()
    if args.smoke:
        args.sizes, args.burst, args.bursts, args.detect, args.spread, args.steady = "50", 5, 1, "2", 5.0, 5.0
    args.sizes = [int(x) for x in args.sizes.split(",") if x]
    args.detect = [int(x) for x in args.detect.split(",") if x]
    sys.exit(asyncio.run(main_async(args)))


if __name__ == "__main__":
    main()
