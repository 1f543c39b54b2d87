"""The main queue's worker polls as worker.py says (``polling()``), and the monitoring bench's worker polls the
same way, so the bench measures what is deployed (issue 37 item 2: woken targets' tasks waited on the
sticky queue for its 10 s timeout, then p50 49 s behind temporalio's one normal-queue poll).

What only running can prove (how long a woken target's task waits) is measured by bench/monitoring.py;
this checks the configuration reaches the SDK and does not drift between the two workers."""

from __future__ import annotations

import ast
from datetime import timedelta
from pathlib import Path

import worker
from tests.workflows.test_watch_registration import _config

ROOT = Path(__file__).resolve().parents[2]


async def test_the_main_queue_is_polled_with_more_pollers_and_a_longer_sticky_wait(temporal_client, tmp_path):
    workers = worker.build_worker(temporal_client, _config(tmp_path, "c"), graceful_shutdown_s=1)
    main = workers.main.config()
    assert main["workflow_task_poller_behavior"].maximum == worker.WORKFLOW_TASK_POLLS > 5  # temporalio's 5
    assert main["activity_task_poller_behavior"].maximum == worker.ACTIVITY_TASK_POLLS > 5
    # more than one poll on the normal queue, where new runs and tasks moved off a sticky queue wait
    assert int(worker.WORKFLOW_TASK_POLLS * main["nonsticky_to_sticky_poll_ratio"]) > 1
    assert main["sticky_queue_schedule_to_start_timeout"] == worker.STICKY_TO_START > timedelta(seconds=10)


def test_the_bench_worker_polls_the_main_queue_as_worker_py_does():
    tree = ast.parse((ROOT / "bench" / "monitor_worker.py").read_text())
    workers = [c for c in ast.walk(tree) if isinstance(c, ast.Call) and getattr(c.func, "id", "") == "Worker"]
    main = [c for c in workers if any(k.arg == "workflows" and "TargetBuildWorkflow" in ast.unparse(k.value)
                                      for k in c.keywords)]
    assert len(main) == 1, "bench/monitor_worker.py: one Worker for the targets' queue"
    assert any(k.arg is None and ast.unparse(k.value) == "polling()" for k in main[0].keywords), \
        "bench/monitor_worker.py: the targets' worker takes **polling() from worker.py"
