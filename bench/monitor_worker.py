"""A worker process for bench/monitoring.py: the real target and watcher workflows, the real watch
activities, and scripted stand-ins (tests/workflows/standins.py) for everything that is not monitoring.

``submit_job`` launches a real job on the Iris controller that prints a build marker every
``--marker-every`` seconds and exits at the absolute epoch second encoded in the request id
(``...-e<epoch>``), so the bench controls when every job ends. Same slots as worker.py.

Run by the bench: ``python bench/monitor_worker.py --temporal HOST:PORT --task-queue TQ --iris-url URL
--cluster NAME --policy '{json}' --work-dir DIR``.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime
import json
import os
import re
import signal
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from temporalio import activity  # noqa: E402
from temporalio.client import Client  # noqa: E402
from temporalio.contrib.pydantic import pydantic_data_converter  # noqa: E402
from temporalio.worker import Worker  # noqa: E402

from activities.watch import WatchActivities  # noqa: E402
from clients.iris import IrisClient, LaunchSpec, Resources  # noqa: E402
from domain.config import PolicySettings, ServiceConfig  # noqa: E402
from domain.models import SubmitInput, SubmittedJob  # noqa: E402
from domain.watch import watcher_task_queue  # noqa: E402
from tests.workflows.standins import Standins  # noqa: E402
from worker import MAX_CONCURRENT_ACTIVITIES, MAX_CONCURRENT_WORKFLOW_TASKS, WATCHER_MAX_CONCURRENT, polling  # noqa: E402
from workflows.target import TargetBuildWorkflow  # noqa: E402
from workflows.watcher import IrisWatcherWorkflow  # noqa: E402

SMALL = Resources(cpu_millicores=10, memory_bytes=32 * 1024**2, disk_bytes=32 * 1024**2)


class SleepJobs(Standins):
    def __init__(self, iris: IrisClient, marker_every_s: float, policy: PolicySettings, push_lead_s: float = 0.0):
        super().__init__(policy=policy)
        self.iris = iris
        self.marker_every_s = marker_every_s
        self.push_lead_s = push_lead_s

    @activity.defn(name="submit_job")
    async def submit_job(self, inp: SubmitInput) -> SubmittedJob:
        job_id = f"/bench/{inp.request_id}"
        self._jobs[job_id] = (inp.target.key, inp.round)
        end = int(re.search(r"-e(\d+)", inp.request_id).group(1))
        texts = [m.text for m in inp.target.expected_markers if m.text]
        markers = texts[:8] or ["step"]
        every = max(1, int(self.marker_every_s))
        # --push-lead S: the build's last two text markers (its final check and kaniko's "Pushing image to")
        # S seconds before the end, then quiet until it: a real image push takes minutes, and these are the
        # markers the watcher's near-the-end cadence keys on. 0: markers cycle until the end (none final).
        lead = int(self.push_lead_s) if len(texts) >= 2 else 0
        until = end - lead
        final = "".join(f"echo {json.dumps(m)}; " for m in texts[-2:]) + f"sleep {lead}" if lead else "true"
        # bash builtins only (printf %T), one sleep per marker: cheap with hundreds of jobs on 2 cores
        script = (f"markers=({' '.join(json.dumps(m) for m in markers)}); i=0; printf -v now '%(%s)T' -1; "
                  f"while [ $now -lt {until} ]; do echo \"${{markers[$((i % {len(markers)}))]}}\"; i=$((i+1)); "
                  f"left=$(({until} - now)); sleep $((left < {every} ? left : {every})); printf -v now '%(%s)T' -1; "
                  f"done; {final}")
        spec = LaunchSpec(name=job_id, argv=["bash", "-c", script], resources=SMALL)
        await self.iris.submit_idempotent(spec)
        return SubmittedJob(job_id=job_id, cluster=inp.target.cluster, attached=False, submitted_at_ms=1)


async def main(args) -> None:
    policy = PolicySettings.model_validate(json.loads(args.policy))
    config = ServiceConfig.model_validate({
        "work_dir": args.work_dir,
        "repos": {"marinskyrl_url": "file:///nowhere", "harbor_url": "file:///nowhere"},
        "clusters": {args.cluster: {"controller_url": args.iris_url,
                                    "client_revision_date": datetime.date.today().isoformat()}},
        "registry": {"image_repository": "127.0.0.1:5000/gpu-rl", "user": {"kind": "literal_public", "value": "u"}, "token": {"kind": "env", "name": "X"}},
        "policy": policy.model_dump(),
    })
    client = await Client.connect(args.temporal, data_converter=pydantic_data_converter)
    # The bench's own submissions go straight to the controller (not through the counting proxy).
    iris = IrisClient(args.submit_url, client_revision_date=datetime.date.today().isoformat())
    jobs = SleepJobs(iris, args.marker_every, policy, args.push_lead)
    standins = [a for a in jobs.all() if a.__temporal_activity_definition.name != "watch_job"]
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    watch = WatchActivities(config)
    # As worker.py: the watcher on a queue of its own (domain/watch.py watcher_task_queue).
    async with Worker(client, task_queue=args.task_queue, workflows=[TargetBuildWorkflow, IrisWatcherWorkflow],
                      activities=[*standins, *watch.all()],
                      max_concurrent_activities=MAX_CONCURRENT_ACTIVITIES,
                      max_concurrent_workflow_tasks=MAX_CONCURRENT_WORKFLOW_TASKS, **polling()), \
            Worker(client, task_queue=watcher_task_queue(args.task_queue), workflows=[IrisWatcherWorkflow],
                   activities=[watch.watch_cluster], max_concurrent_activities=WATCHER_MAX_CONCURRENT,
                   max_concurrent_workflow_tasks=WATCHER_MAX_CONCURRENT):
        print("bench worker started", flush=True)
        await stop.wait()
    await iris.aclose()


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--temporal", required=True)
    ap.add_argument("--task-queue", required=True)
    ap.add_argument("--iris-url", required=True, help="the controller as the watcher sees it (counting proxy)")
    ap.add_argument("--submit-url", required=True, help="the controller for the bench's own submissions")
    ap.add_argument("--cluster", required=True)
    ap.add_argument("--policy", required=True)
    ap.add_argument("--work-dir", required=True)
    ap.add_argument("--marker-every", type=float, default=20.0)
    ap.add_argument("--push-lead", type=float, default=0.0, help="the final markers this many seconds before the end")
    asyncio.run(main(ap.parse_args()))
    sys.stdout.flush()
    os._exit(0)
