"""Find a build's evidence from Temporal history alone, and read it from the evidence store.

Why history: it is the record that outlives every worker. The results of ``capture_failure`` and
``check_build_log`` carry each file's store URI and sha256, so ``starter.py logs`` and
``starter.py evidence`` work for running and finished builds, with no worker and no worker disk.
Runs chained by continue-as-new are followed back to the first.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from temporalio.api.enums.v1 import EventType
from temporalio.client import Client

from clients.evidence import EvidenceError, read_evidence, safe_name
from domain.evidence import excerpt
from domain.models import CapturedFailure, CaptureInput, FileRef, LogCheck, LogCheckInput

_INPUTS = {"capture_failure": CaptureInput, "check_build_log": LogCheckInput}
_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")


def printable(text: str) -> str:
    """Log text made safe for a terminal: no escape sequences or other control characters."""
    return _CONTROL.sub("", text)


@dataclass
class EvidenceItem:
    target: str
    kind: str  # "failure log" | "diagnostics" | "build log"
    job_id: str
    ref: FileRef
    failure_class: str | None = None
    failing_line: str | None = None


async def _history_events(client: Client, workflow_id: str) -> list:
    """Events of every run of ``workflow_id``, oldest run first (continue-as-new chains followed)."""
    runs: list[list] = []
    run_id: str | None = None
    while True:
        events = [e async for e in client.get_workflow_handle(workflow_id, run_id=run_id).fetch_history_events()]
        runs.append(events)
        started = events[0].workflow_execution_started_event_attributes if events else None
        run_id = started.continued_execution_run_id if started else ""
        if not run_id:
            break
    return [e for events in reversed(runs) for e in events]


def _child_ids(events: list) -> list[str]:
    return [e.child_workflow_execution_started_event_attributes.workflow_execution.workflow_id
            for e in events if e.event_type == EventType.EVENT_TYPE_CHILD_WORKFLOW_EXECUTION_STARTED]


async def _target_items(client: Client, workflow_id: str, events: list) -> list[EvidenceItem]:
    key = workflow_id.rsplit("/", 1)[-1]
    scheduled: dict[int, tuple[str, str]] = {}  # event id -> (activity type, job id)
    items: list[EvidenceItem] = []
    for e in events:
        if e.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED:
            a = e.activity_task_scheduled_event_attributes
            name = a.activity_type.name
            if name in _INPUTS and a.input.payloads:
                (inp,) = await client.data_converter.decode(a.input.payloads[:1], [_INPUTS[name]])
                scheduled[e.event_id] = (name, inp.job_id)
        elif e.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_COMPLETED:
            a = e.activity_task_completed_event_attributes
            if a.scheduled_event_id not in scheduled or not a.result.payloads:
                continue
            name, job = scheduled[a.scheduled_event_id]
            if name == "capture_failure":
                (cap,) = await client.data_converter.decode(a.result.payloads, [CapturedFailure])
                if cap.log:
                    items.append(EvidenceItem(key, "failure log", job, cap.log, str(cap.classification.failure_class),
                                              cap.failing_line))
                items.append(EvidenceItem(key, "diagnostics", job, cap.diagnostics,
                                          str(cap.classification.failure_class), cap.failing_line))
            else:
                (check,) = await client.data_converter.decode(a.result.payloads, [LogCheck])
                items.append(EvidenceItem(key, "build log", job, check.log))
    return items


async def collect(client: Client, workflow_id: str) -> list[EvidenceItem]:
    """Every evidence file of a pipeline (all its targets) or of one target workflow, in order."""
    events = await _history_events(client, workflow_id)
    children = list(dict.fromkeys(_child_ids(events)))
    if not children:
        return await _target_items(client, workflow_id, events)
    items: list[EvidenceItem] = []
    for child in children:
        items += await _target_items(client, child, await _history_events(client, child))
    return items


def failed_steps(items: list[EvidenceItem], target: str | None = None) -> list[EvidenceItem]:
    """The latest failure log of each target (or of ``target``)."""
    latest: dict[str, EvidenceItem] = {}
    for it in items:
        if it.kind == "failure log" and (target is None or it.target == target):
            latest[it.target] = it
    return list(latest.values())


def render_failed_step(item: EvidenceItem, storage_options: dict | None = None, *, full: bool = False) -> list[str]:
    """Header plus the excerpt around the failing line (like ``gh run view --log-failed``)."""
    text = read_evidence(item.ref, storage_options).decode(errors="replace")
    out = [f"== {item.target} · {item.job_id} · {item.failure_class} · {item.ref.uri} "
           f"(sha256 {item.ref.sha256[:16]}…)"]
    if full:
        numbered = [(n, line, False) for n, line in enumerate(text.splitlines(), 1)]
    else:
        numbered = excerpt(text)
        if not numbered:
            return out + ["(the log is empty)"]
        if numbered[0][0] > 1:
            out.append(f"… {numbered[0][0] - 1} earlier line(s); --full prints them")
    shown = None  # the Iris log key the lines below come from
    for n, line, failing in numbered:
        m = _IRIS_PREFIX.match(line)
        if m and m["key"] != shown:
            shown = m["key"]
            out.append(f"-- {printable(m['key'])}")
        text_only = line if not m else m["data"] if m["source"] == "stdout" else f"[{m['source']}] {m['data']}"
        out.append(printable(text_only) if full else f"{'>' if failing else ' '}{n:>6} | {printable(text_only)}")
    return out


# A stored build log line as activities/build.py writes it: ``[<task key>:<attempt> <source>] <data>``. The key
# (/<user>/<job>/<task>:<attempt>, about 70 characters) is printed once, when it changes, not on every line;
# a source other than stdout stays as a short mark.
_IRIS_PREFIX = re.compile(r"^\[(?P<key>/\S+) (?P<source>\w+)\] ?(?P<data>.*)$")


def download(items: list[EvidenceItem], dest: Path, storage_options: dict | None = None) -> list[Path]:
    """Copy every file (digest-checked) to ``dest/<target>/<name>``; returns the written paths."""
    written = []
    for it in items:
        data = read_evidence(it.ref, storage_options)
        path = dest / safe_name(it.target) / it.ref.uri.rsplit("/", 1)[-1]
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
        written.append(path)
    return written


__all__ = ["EvidenceError", "EvidenceItem", "collect", "download", "failed_steps", "printable", "render_failed_step"]
