"""The controller's audit line parser (domain/controller_feed.py) on lines the real 0.2.227 controller wrote to
/system/controller (copied from a local run, 2026-12-06), and on forms a job could make it write."""

from __future__ import annotations

import pytest

from domain.controller_feed import parse_audit_line

REAL = {
    "2026-12-06 14:54:20,247 iris.cluster.controller.audit_logging event=job_terminated entity=/tester/fail-40db01 "
    "trigger=task_updates_applied reason=Cumulative failed task attempts exceeded max_task_failures: failures=1, "
    "limit=0; Exit code: 3": ("job_terminated", "/tester/fail-40db01", "/tester/fail-40db01"),
    "2026-12-06 14:54:42,246 iris.cluster.controller.audit_logging event=job_cancelled entity=/tester/forge-40db01 "
    "trigger=- reason=Terminated by user": ("job_cancelled", "/tester/forge-40db01", "/tester/forge-40db01"),
    "2026-12-06 14:54:16,993 iris.cluster.controller.audit_logging event=assignment_queued "
    "entity=/tester/fail-40db01/0 trigger=- worker=worker-iris-cpu-0": ("assignment_queued", "/tester/fail-40db01/0", None),
    "2026-12-06 14:54:16,614 iris.cluster.controller.audit_logging event=job_submitted entity=/tester/fail-40db01 "
    "trigger=- num_tasks=1": ("job_submitted", "/tester/fail-40db01", None),
    "2026-12-06 14:54:20,000 iris.cluster.controller.audit_logging event=task_timeout entity=/tester/a/0 trigger=- "
    "reason=x": ("task_timeout", "/tester/a/0", "/tester/a"),
}


@pytest.mark.parametrize("line", list(REAL))
def test_the_controller_s_own_lines_name_their_action_and_job(line):
    ev = parse_audit_line(line)
    assert ev is not None
    action, entity, job = REAL[line]
    assert (ev.action, ev.entity, ev.job_id()) == (action, entity, job)


FORGED = "2026-12-06 14:54:20,247 iris.cluster.controller.audit_logging event=job_terminated entity=/tester/w trigger=-"


@pytest.mark.parametrize("data,source", [
    # local mode: a task's argv inside the runtime's own line under /system/controller
    ("2026-12-06 14:54:17,031 iris.cluster.runtime.process Starting local container (task_id=/tester/f/0, "
     f"job_id=/tester/f, cmd=['bash', '-c', \"echo '{FORGED}'\"])", "process"),
    (FORGED, "stdout"),  # what a job prints (never under that key; refused whatever the key)
    (FORGED, "stderr"),
    ("x " + FORGED, "process"),
    ("2026-12-06 14:54:20,247 iris.cluster.controller.other event=job_terminated entity=/tester/w trigger=-", "process"),
    ("14:54:20,247 iris.cluster.controller.audit_logging event=job_terminated entity=/tester/w trigger=-", "process"),
    ("2026-12-06 14:54:20,247 iris.cluster.controller.audit_logging event=job_terminated entity=/tester/w", "process"),
])
def test_anything_else_is_not_an_audit_line(data, source):
    assert parse_audit_line(data, source=source) is None


def test_a_reason_cannot_add_a_second_event():
    """A reason is the job's error text (a task's output can reach it): only the line's own head is read."""
    ev = parse_audit_line("2026-12-06 14:54:20,247 iris.cluster.controller.audit_logging event=job_terminated "
                          f"entity=/tester/a trigger=task_updates_applied reason=boom\n{FORGED}")
    assert (ev.action, ev.entity) == ("job_terminated", "/tester/a")
