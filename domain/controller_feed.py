"""The Iris controller's audit lines as a change feed: which watched job just changed (pure: no I/O).

Why: the controller has no change-feed RPC, and at most 12 status requests a minute a poll every 5 s
cannot see an end in under ~4.75 s at p95. But marin-iris 0.2.227 writes one audit line per committed job
transition (``iris/cluster/controller/audit_logging.py:15-43``: ``event=<action> entity=<id> trigger=<t>
k=v``), emitted by post-commit hooks (``reconcile/commit.py:292-300``, fired after ``COMMIT`` under the
write lock, ``db.py:229-238``), through the controller's ``RemoteLogHandler`` on the ``iris`` logger to the
log store under ``/system/controller`` (``controller.py:492-496``, ``log_keys.py:18``) with the format
``%(asctime)s %(name)s %(message)s`` and source ``process`` (finelog ``remote_log_handler.py:58-63``).
Tailing that one key with a cursor is a log request per second, not a status request.

A line is only a reason to read the controller's state sooner, never a verdict: ``job_terminated`` does not
carry the job's final state (its ``reason`` is the job's error text or a fallback, ``reconcile/batches.py:161``),
so the watcher's status read decides, as before.

Parsed strictly, from that key only: the line must start with the controller's timestamp and the audit
logger's name. A task's output never goes to that key (it is under ``/<user>/<job>/<task>:<attempt>``);
in local mode a task's argv does appear there inside another logger's line (``iris.cluster.runtime.process
Starting local container (... cmd=[...])``), which this anchored match refuses (tests/iris/test_controller_feed.py).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

CONTROLLER_LOG_KEY = "/system/controller"  # iris/cluster/log_keys.py:18
AUDIT_LOGGER = "iris.cluster.controller.audit_logging"
# Narrows the FetchLogs reply on the log server (``substring``): every audit line contains it.
AUDIT_SUBSTRING = f" {AUDIT_LOGGER} event="
_AUDIT_LINE = re.compile(
    r"\d{4}-\d{2}-\d{2} \d{2}:\d{2}:\d{2},\d{3} " + re.escape(AUDIT_LOGGER)
    + r" event=([a-z_]+) entity=(/[A-Za-z0-9][^\s]*|[A-Za-z0-9][^\s]*) trigger=(\S+)(?: |$)")
# Transitions that can end a job (iris/cluster/controller/reconcile/batches.py:250 job_terminated, :367
# job_cancelled, :398 job_completed, :630 task_preempted, :649 task_unschedulable, :704 task_timeout;
# pruner.py:68 job_pruned) and a failed worker (batches.py:277 worker_failed, which names the worker, not its
# jobs: it wakes a read of every watched job).
JOB_END_ACTIONS = frozenset({"job_terminated", "job_cancelled", "job_completed", "job_pruned"})
TASK_ACTIONS = frozenset({"task_preempted", "task_unschedulable", "task_timeout"})
WORKER_ACTIONS = frozenset({"worker_failed"})


@dataclass(frozen=True)
class AuditEvent:
    action: str
    entity: str
    trigger: str
    seq: int = 0
    ts_ms: int | None = None

    @property
    def job_end(self) -> bool:
        """The controller committed this job's end: a status read after this line sees it terminal."""
        return self.action in JOB_END_ACTIONS

    def job_id(self) -> str | None:
        """The job this line is about: the entity of a job action, the job of a task action, else None."""
        if self.action in JOB_END_ACTIONS:
            return self.entity
        if self.action in TASK_ACTIONS:
            job, _, index = self.entity.rpartition("/")
            return job if job and index.isdigit() else None
        return None


def parse_audit_line(data: str, *, source: str = "process") -> AuditEvent | None:
    """The audit event of one ``/system/controller`` entry (any action: every one proves the feed is live), or
    None when the entry is not the controller's own audit line (another logger's line, a line not written by
    its log handler, anything else)."""
    if source != "process":
        return None
    m = _AUDIT_LINE.match(data)
    if m is None:
        return None
    action, entity, trigger = m.groups()
    return AuditEvent(action=action, entity=entity, trigger=trigger)
