"""A workflow's history in one short line per event, for assertion messages.

Why: a test that times out waiting for a state ("green", "merged") under full-suite load says only that it
timed out; the history says what the build did instead (each activity with its result or failure, each
signal and update), so a flake in CI is diagnosed from its own output instead of guessed at."""

from __future__ import annotations

import json

from temporalio.api.enums.v1 import EventType

SKIP = {EventType.EVENT_TYPE_WORKFLOW_TASK_SCHEDULED, EventType.EVENT_TYPE_WORKFLOW_TASK_STARTED,
        EventType.EVENT_TYPE_WORKFLOW_TASK_COMPLETED, EventType.EVENT_TYPE_ACTIVITY_TASK_STARTED}
WIDTH = 400  # characters of a payload or failure shown per event


def _compact(data: bytes) -> str:
    """A JSON payload without its empty fields (a ReviewState is mostly defaults), long texts cut, at most WIDTH."""
    text = data.decode(errors="replace")
    try:
        value = json.loads(text)
    except ValueError:
        return text[:WIDTH]
    if isinstance(value, dict):
        value = {k: (v[:60] + "…" if isinstance(v, str) and len(v) > 61 else v)
                 for k, v in value.items() if v not in (None, False, "", [], {}, 0)}
    return json.dumps(value, separators=(",", ":"))[:WIDTH]


async def history_digest(handle, limit: int = 200) -> str:
    """The last ``limit`` events of ``handle``'s current run, one line each (never raises)."""
    try:
        events = [e async for e in handle.fetch_history_events()]
    except Exception as e:  # noqa: BLE001 - a diagnosis must not replace the assertion it explains
        return f"history unreadable: {e!r}"
    scheduled: dict[int, str] = {}
    lines = []
    for e in events:
        if e.event_type in SKIP:
            continue
        name = EventType.Name(e.event_type).removeprefix("EVENT_TYPE_").lower()
        extra = ""
        if e.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED:
            a = e.activity_task_scheduled_event_attributes
            scheduled[e.event_id] = a.activity_type.name
            extra = f"{a.activity_type.name} id={a.activity_id}"
        elif e.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_COMPLETED:
            a = e.activity_task_completed_event_attributes
            data = _compact(a.result.payloads[0].data) if a.result.payloads else ""
            extra = f"{scheduled.get(a.scheduled_event_id, '?')} -> {data}"
        elif e.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_FAILED:
            a = e.activity_task_failed_event_attributes
            extra = f"{scheduled.get(a.scheduled_event_id, '?')}: {a.failure.message[:WIDTH]}"
        elif e.event_type in (EventType.EVENT_TYPE_ACTIVITY_TASK_CANCEL_REQUESTED,
                              EventType.EVENT_TYPE_ACTIVITY_TASK_CANCELED):
            attrs = (e.activity_task_cancel_requested_event_attributes
                     if e.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_CANCEL_REQUESTED
                     else e.activity_task_canceled_event_attributes)
            extra = scheduled.get(attrs.scheduled_event_id, "?")
        elif e.event_type == EventType.EVENT_TYPE_WORKFLOW_EXECUTION_SIGNALED:
            a = e.workflow_execution_signaled_event_attributes
            data = _compact(a.input.payloads[0].data) if a.input.payloads else ""
            extra = f"{a.signal_name} {data}"
        elif e.event_type == EventType.EVENT_TYPE_WORKFLOW_EXECUTION_UPDATE_ACCEPTED:
            extra = e.workflow_execution_update_accepted_event_attributes.accepted_request.input.name
        lines.append(f"  {e.event_id:>4} {e.event_time.ToDatetime():%H:%M:%S.%f} {name} {extra}".rstrip())
    shown = lines[-limit:]
    head = f"history of {handle.id} ({len(events)} events, {len(lines) - len(shown)} older not shown):"
    return "\n".join([head, *shown])
