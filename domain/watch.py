"""What the per-cluster Iris watcher tracks and when it wakes a target (pure: no I/O, no Temporal).

Why one watcher per cluster: a target that polls its own job costs the controller a request per
target per interval and its own history an activity per interval. The watcher asks once per interval
for the states of every watched job (``GetJobState`` with all ids), fetches details only for jobs whose
state changed, and wakes a target only when there is something to act on:

- a state change (or a job that vanished) wakes it at once;
- progress (a new build marker, a preemption, the controller becoming unreachable or reachable again)
  wakes it at most once per ``progress_signal_s``, so a target's history grows with events, not time.

Everything else (the latest marker, elapsed time, pending reason) is in the watcher activity's
heartbeat details, which the Temporal UI and ``starter.py follow`` read without touching history.
"""

from __future__ import annotations

import hashlib

from pydantic import BaseModel, Field

from domain.models import JobProgress

# Every payload the watcher sends or receives (query replies, heartbeat details, signals, the
# continue-as-new input) stays under Temporal's 512 KB warning whatever the number of watched jobs:
# replies are pages cut at this many bytes of entries, batches of what targets were told are cut at
# TOLD_BATCH entries, and the continue-as-new input names the previous run instead of carrying its set.
PAGE_BUDGET_BYTES = 192 * 1024
# Adoption reads a closed run, and every query of a closed run replays its whole history on a worker: its
# pages are twice as large (entries are counted at an upper bound of their size: a 192 KB page measured
# 116 KB, so such a page is ~230 KB), which halves those replays.
ADOPT_PAGE_BUDGET_BYTES = 384 * 1024
TOLD_BATCH = 200


def watcher_id(cluster: str, task_queue: str) -> str:
    """The one watcher workflow of a cluster for the workers of ``task_queue`` (a fixed id: every target
    of the cluster finds it). The task queue is part of the id because the watcher runs where its
    targets' workers poll: a deployment (or a test) on another queue must not signal a watcher whose
    workers are elsewhere, or gone, and wait for its targets' safety timers instead."""
    return f"iris-watcher/{task_queue}/{cluster}"


def watcher_task_queue(task_queue: str) -> str:
    """The task queue the watcher workflows of ``task_queue``'s workers run on (``worker.py`` polls it with
    a second worker of its own slots and pollers): the watcher's workflow tasks and its poll activity never
    wait behind the targets' (200 targets starting together held the watcher's first task 69-105 s on one
    shared queue). The watcher's id keeps naming the main queue (``watcher_id``)."""
    return f"{task_queue}-watcher"


def user_prefix(job_id: str) -> str:
    """``/<user>/`` of a wire job id: the anchored ``ListJobs`` prefix that covers this service's jobs."""
    parts = job_id.split("/")
    return f"/{parts[1]}/" if len(parts) > 2 and parts[1] else "/"


def marker_set_key(markers: list[str]) -> str:
    """A stable key of a marker list: the watcher holds each build contract's markers once (31 texts,
    ~2 KB) and every job refers to them by this key."""
    return hashlib.sha256("\n".join(markers).encode()).hexdigest()[:16] if markers else ""


class WatchRequest(BaseModel):
    """A target asks to be woken on changes of ``job_id``; ``known`` is what the target knows now
    (the watcher signals anything that differs from it).

    ``marker_set`` names the build contract's marker texts (``marker_set_key``). The texts travel to a
    watcher run once per contract: ``watch_job`` puts them inline in the first registration of a key it
    sends to a run, or in a ``markers`` signal (``MarkerSet``) when it finds the run changed; every other
    registration carries the key only (~400 bytes, not ~2.5 KB), so a signal costs the watcher the same
    whatever the contract. Registrations of the previous release carry the texts and no key: the watcher
    derives the key. What the watcher holds, pages and hands over always has ``markers`` empty."""

    job_id: str
    workflow_id: str  # the target workflow to wake (signal ``job_changed``)
    markers: list[str] = Field(default_factory=list)  # marker texts whose latest sighting is progress
    known: JobProgress
    registered_at: str  # the target's workflow time at registration: a re-registration resets ``known``
    marker_set: str = ""  # key into the watcher's marker sets (set by the sender, or derived by the watcher)


class MarkerSet(BaseModel):
    """The ``markers`` signal: one build contract's marker texts under their key, sent to a watcher run
    that was given registrations naming ``key`` without the texts."""

    key: str
    markers: list[str]


class WatchJobInput(BaseModel):
    cluster: str
    job_id: str
    workflow_id: str
    markers: list[str] = Field(default_factory=list)
    known: JobProgress | None = None
    registered_at: str


class FollowRequest(BaseModel):
    """Someone follows these jobs: read their logs at the faster follow cadence until ``until_s``."""

    job_ids: list[str]
    until_s: float  # epoch seconds


class WatcherInput(BaseModel):
    """The watcher workflow's input. Since the bounded watch set, a continued run carries only the
    previous run's id (its watches are adopted in pages by the watch activity); ``watches`` and
    ``following`` are what runs of the previous release carried across continue-as-new."""

    cluster: str
    watches: list[WatchRequest] = Field(default_factory=list)
    following: dict[str, float] = Field(default_factory=dict)  # job id -> until (epoch s)
    previous_run_id: str | None = None  # adopt this closed run's watch set (paged) before anything else
    events_per_run: int = 2000  # continue-as-new past this many history events


class PageRequest(BaseModel):
    """``changes`` query: entries changed after revision ``since`` (0: the whole set), one page."""

    since: int = 0
    budget_bytes: int = PAGE_BUDGET_BYTES


class WatchPage(BaseModel):
    """One page of the watch set in revision order. ``next`` is the ``since`` of the next page; ``more``
    says a next page exists now. Marker sets are included for the page's jobs only."""

    watches: list[WatchRequest] = Field(default_factory=list)
    removed: list[str] = Field(default_factory=list)
    marker_sets: dict[str, list[str]] = Field(default_factory=dict)
    following: dict[str, float] = Field(default_factory=dict)
    next: int = 0
    more: bool = False
    watched: int = 0  # jobs watched in all
    adopting: str | None = None  # a previous run whose watch set is not adopted yet
    continue_suggested: bool = False  # the run's history is long: return, the workflow continues as new
    # The run that answered (the current one). A watch activity of an earlier run (continued as new while it
    # polled: it learns of its cancellation only on a heartbeat, seconds later) stops when it sees another.
    run_id: str = ""


class AdoptChunk(BaseModel):
    """A page of a previous run's watch set, signalled to the current run (``done`` on the last)."""

    from_run_id: str
    watches: list[WatchRequest] = Field(default_factory=list)
    marker_sets: dict[str, list[str]] = Field(default_factory=dict)
    following: dict[str, float] = Field(default_factory=dict)
    done: bool = False


class WatchSet(BaseModel):
    """What the watcher workflow holds now (its ``watched`` query), read by the watch activity."""

    watches: list[WatchRequest] = Field(default_factory=list)
    following: dict[str, float] = Field(default_factory=dict)


class WatchClusterInput(BaseModel):
    cluster: str
    return_after_s: float = 3600.0  # the activity ends and is restarted by the workflow (history stays small)


class WatchClusterResult(BaseModel):
    polls: int = 0
    signals: int = 0
    requests: dict[str, int] = Field(default_factory=dict)  # Iris RPC method -> requests


def is_state_change(known: JobProgress, now: JobProgress) -> bool:
    """A change the target acts on: a new Iris state, terminal, or the job vanished."""
    return now.state != known.state or now.terminal != known.terminal or now.missing != known.missing


def is_progress_change(known: JobProgress, now: JobProgress) -> bool:
    """A change only the progress line shows."""
    return (now.last_marker != known.last_marker or now.preemptions != known.preemptions
            or now.attempt != known.attempt or now.failures != known.failures
            or now.controller_reachable != known.controller_reachable)


def should_wake(known: JobProgress, now: JobProgress, *, since_last_wake_s: float, progress_signal_s: float) -> bool:
    """Wake the target at once on a state change; on progress only if it was not woken recently.

    An unknown state (nothing fetched yet, or the controller unreachable before the first answer) never
    wakes anyone: an unreachable controller is never a statement about the job."""
    if now.state == "unknown":
        return False
    if is_state_change(known, now):
        return True
    return is_progress_change(known, now) and since_last_wake_s >= progress_signal_s
