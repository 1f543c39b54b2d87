"""Activity options and the retry policy of every workflow, in one place.

Why one place: three workflows used to carry their own retry lists, which drifted (names matching no
class, a base class that never matched its subclasses). Here the non-retryable list is built from the
error boundary's own classes (activities/errors.py), and every step gets the same three bounds:

- a heartbeat timeout sized to the activities' background heartbeat (activities/common.py), so a
  step whose worker died runs again within seconds on another worker;
- a start-to-close timeout per attempt, sized to the step;
- a bounded number of attempts (about ``IO_BUDGET`` of backoff), so a dependency that stays
  unreachable (GitHub, Iris, the registry, a git remote) ends the step with its last error instead of
  retrying forever. While it retries, the step, its attempt count and last failure show as a pending
  activity (UI, ``describe``).
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from temporalio import workflow
from temporalio.common import RetryPolicy

with workflow.unsafe.imports_passed_through():
    from activities.common import HEARTBEAT_EVERY_S
    from activities.errors import NON_RETRYABLE_TYPES

# A dead worker's step is retried after this much silence (plus the retry's initial interval).
HEARTBEAT_TIMEOUT = timedelta(seconds=max(10.0, 5 * HEARTBEAT_EVERY_S))
# How long one step may keep failing transiently before the build stops with the step's last error.
IO_BUDGET = timedelta(minutes=30)
INITIAL_INTERVAL = timedelta(seconds=2)
BACKOFF = 2.0
MAX_INTERVAL = timedelta(seconds=60)


def attempts_within(budget: timedelta) -> int:
    """How many attempts fit in ``budget`` of backoff: the bound is an attempt count, not a
    schedule-to-close timer, so time-skipping tests never jump over a step that is merely queued."""
    attempts, spent, interval = 1, timedelta(0), INITIAL_INTERVAL
    while spent + interval <= budget:
        spent += interval
        attempts += 1
        interval = min(interval * BACKOFF, MAX_INTERVAL)
    return attempts


def retry_within(budget: timedelta) -> RetryPolicy:
    return RetryPolicy(initial_interval=INITIAL_INTERVAL, backoff_coefficient=BACKOFF, maximum_interval=MAX_INTERVAL,
                       maximum_attempts=attempts_within(budget), non_retryable_error_types=list(NON_RETRYABLE_TYPES))


IO_RETRY = retry_within(IO_BUDGET)


def io_step(start_to_close: timedelta, *, retry: RetryPolicy = IO_RETRY) -> dict[str, Any]:
    """Keyword arguments for ``workflow.execute_activity*``: retried, heartbeat-checked, bounded."""
    return dict(start_to_close_timeout=start_to_close, heartbeat_timeout=HEARTBEAT_TIMEOUT, retry_policy=retry)


# Pipeline (workflows/pipeline.py)
LOAD_STATE = io_step(timedelta(minutes=10))
PREPARE_SOURCE = io_step(timedelta(minutes=15))
PLAN_TARGETS = io_step(timedelta(minutes=5))
# A service that did not answer during preflight is retried a few times (about a minute), then the build
# stops with the cause (nothing was done yet); a missing credential, permission or tool is final at once.
PREFLIGHT = io_step(timedelta(minutes=5), retry=retry_within(timedelta(seconds=60)))
PUBLISH_SOURCE = io_step(timedelta(minutes=15))
RECORD = io_step(timedelta(minutes=15))
MERGE = io_step(timedelta(minutes=5))
# An operator command waits on this (the CLI blocks until the update completes): a GitHub outage fails it
# within about a minute, with the cause, rather than holding the operator's terminal for half an hour.
AUTHORIZE = io_step(timedelta(minutes=1), retry=retry_within(timedelta(seconds=60)))


def watch_pull_request(return_after_s: float) -> dict[str, Any]:
    # Review can take days: only a GitHub outage longer than this ends the wait.
    return io_step(timedelta(seconds=return_after_s + 300), retry=WATCH_RETRY)


WATCH_RETRY = retry_within(timedelta(hours=2))


# Target (workflows/target.py)
POLICY = io_step(timedelta(seconds=30))
SUBMIT = io_step(timedelta(minutes=5))
# Long enough to wait for a log slot (activities/log_reads.py LOG_SLOTS: at most 16 whole logs in memory per
# worker) behind 200 targets that ended together: 473 s for the last one at load 7-10 (bench/end_phase.py),
# which a 10-minute bound would cut and retry at the back of the queue. The wait heartbeats, so a dead worker
# is still seen within HEARTBEAT_TIMEOUT.
CHECK_LOG = io_step(timedelta(minutes=30))
CAPTURE = io_step(timedelta(minutes=10))
VALIDATE = io_step(timedelta(minutes=10))
TERMINATE = io_step(timedelta(minutes=2))
# Pipeline, before a target's child: re-check an earlier validated build (Temporal, evidence store, registry).
ADOPT = io_step(timedelta(minutes=10))


def monitor_job(return_after_s: float) -> dict[str, Any]:
    """Runs started before the cluster watcher (workflows/patches.py CLUSTER_WATCHER)."""
    return io_step(timedelta(seconds=return_after_s + 120))


WATCH_JOB = io_step(timedelta(minutes=2))


# Iris watcher (workflows/watcher.py): one long activity per cluster, restarted at once after a crash.
# It reports an unreachable controller per job and never fails on it; what is left (a bug, Temporal
# unreachable) is retried within the budget, then the watcher fails and the targets' safety re-checks
# start a new one.
def watch_cluster(return_after_s: float) -> dict[str, Any]:
    return io_step(timedelta(seconds=return_after_s + 600),
                   retry=RetryPolicy(initial_interval=timedelta(seconds=1), backoff_coefficient=BACKOFF,
                                     maximum_interval=timedelta(seconds=10),
                                     maximum_attempts=attempts_within(IO_BUDGET),
                                     non_retryable_error_types=list(NON_RETRYABLE_TYPES)))


# Rebuild check (workflows/rebuild.py)
REBUILD_DECISION = io_step(timedelta(minutes=10))
