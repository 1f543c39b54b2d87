"""What ``status``, ``schedule list`` and ``schedule describe`` show: the same rows as a table (text) and
as JSON (``--json``), read from Temporal visibility and schedule descriptions (no worker needed).

Why separate from starter.py: the CLI stays a thin shell over these, and tests can read the row values
without parsing a table.
"""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta
from typing import Any

from temporalio.client import Client, ScheduleActionExecutionStartWorkflow, ScheduleSpec

from runtime import operator_client as oc
from runtime import search_attributes as sa
from runtime.tables import duration, when

DEFAULT_QUERY = "WorkflowType = 'BuildPipelineWorkflow'"
ALL_KINDS_QUERY = "WorkflowType IN ('BuildPipelineWorkflow', 'RebuildCheckWorkflow')"
STATUS_HEADERS = ("workflow", "kind", "status", "stage", "failure class", "started (UTC)", "ended (UTC)",
                  "duration", "waiting for")
SCHEDULE_HEADERS = ("schedule", "state", "runs", "next run (UTC)", "last run (UTC)", "last check", "note")
# On a narrow terminal these columns go first, in this order, so the id (first column) is never cut; "waiting
# for" goes last of all (after the stage it is read from): at 80 columns it stays beside the id.
STATUS_DROP = ("kind", "ended (UTC)", "duration", "started (UTC)", "failure class", "status", "stage",
               "waiting for")
SCHEDULE_DROP = ("note", "last run (UTC)", "runs", "next run (UTC)", "last check", "state")
# (the last check's full decision and reasons: `schedule describe`, `report <check id>`)


def status_query(query: str | None, all_kinds: bool) -> str:
    """The visibility query ``status`` runs: builds only (BuildKind = 'build'), unless ``--all`` or the
    query names BuildKind itself. Runs from before BuildKind existed have none and are kept."""
    if all_kinds:
        return query or ALL_KINDS_QUERY
    base = query or DEFAULT_QUERY
    if "buildkind" in base.lower():
        return base
    return f"({base}) AND (BuildKind = '{sa.BuildKind.BUILD.value}' OR BuildKind IS NULL)"


async def workflow_rows(client: Client, query: str, limit: int) -> list[dict[str, Any]]:
    rows = []
    now = datetime.now(UTC)
    async for wf in client.list_workflows(query, limit=limit):
        attrs = wf.typed_search_attributes
        end = wf.close_time or now
        rows.append({
            "workflow_id": wf.id, "run_id": wf.run_id, "workflow_type": wf.workflow_type,
            "kind": attrs.get(sa.KIND), "status": wf.status.name.lower() if wf.status else None,
            "stage": attrs.get(sa.STAGE), "failure_class": attrs.get(sa.FAILURE_CLASS),
            "start_time": wf.start_time.isoformat() if wf.start_time else None,
            "close_time": wf.close_time.isoformat() if wf.close_time else None,
            "duration_s": round((end - wf.start_time).total_seconds(), 1) if wf.start_time else None,
            "waiting_for": waiting_for(attrs.get(sa.STAGE), attrs.get(sa.FAILURE_CLASS),
                                       wf.status.name.lower() if wf.status else None),
        })
    return rows


# What a running build or target waits for, read from its search attributes alone (no worker needed): the
# stage and, while waiting, the failure class the wait is about (workflows/target.py, workflows/pipeline.py).
WAITING_FOR = {"visibility": "package made public, then recheck",
               "validation_inconclusive": "the registry, then recheck"}


def waiting_for(stage: str | None, failure_class: str | None, status: str | None) -> str:
    if status not in (None, "running"):
        return "-"
    if stage == "waiting":
        if failure_class is None:  # a pipeline: one of its targets waits
            return "a target (follow shows which)"
        return WAITING_FOR.get(failure_class, "operator decision (decide)")
    if stage == "awaiting_merge":
        return "green checks + approve-merge"
    if stage in ("queued", None) and status == "running":
        return "a worker"
    return "-"


def status_table(rows: list[dict[str, Any]]) -> list[list[str]]:
    def t(iso: str | None) -> str:
        return when(datetime.fromisoformat(iso)) if iso else "-"
    return [[r["workflow_id"], r["kind"] or "-", r["status"] or "-", r["stage"] or "-", r["failure_class"] or "-",
             t(r["start_time"]), t(r["close_time"]) if r["close_time"] else "(running)", duration(r["duration_s"]),
             r.get("waiting_for") or waiting_for(r["stage"], r["failure_class"], r["status"])]
            for r in rows]


def spec_text(spec: ScheduleSpec | None, memo: dict[str, Any] | None = None) -> str:
    """How often: the operator's own words when the schedule recorded them, else read from the spec."""
    if memo and memo.get("spec"):
        return str(memo["spec"])
    if spec is None:
        return "-"
    parts = [f"cron '{c}'" for c in spec.cron_expressions]
    parts += [f"every {_every(i.every)}" for i in spec.intervals]
    if spec.calendars and not spec.cron_expressions:
        parts.append(f"{len(spec.calendars)} calendar rule(s)")
    tz = f" ({spec.time_zone_name})" if spec.time_zone_name else ""
    return (", ".join(parts) or "-") + tz


def _every(every: timedelta) -> str:
    hours = every.total_seconds() / 3600
    return f"{hours:g}h" if hours >= 1 else f"{every.total_seconds() / 60:g}m"


async def _last_check(client: Client, recent) -> tuple[dict[str, Any] | None, oc.RebuildCheckView | None]:
    if not recent:
        return None, None
    last = max(recent, key=lambda a: a.scheduled_at)
    action = last.action
    if not isinstance(action, ScheduleActionExecutionStartWorkflow):
        return {"scheduled_at": last.scheduled_at.isoformat()}, None
    try:
        view = await oc.read_rebuild_check(client, action.workflow_id, action.first_execution_run_id)
    except oc.CommandError as e:  # e.g. the run is past the namespace's retention
        view = oc.RebuildCheckView(workflow_id=action.workflow_id, run_id=action.first_execution_run_id,
                                   status="unknown", started_at=last.started_at, closed_at=None, error=e.message)
    return {"scheduled_at": last.scheduled_at.isoformat(), "workflow_id": action.workflow_id}, view


async def schedule_rows(client: Client) -> list[dict[str, Any]]:
    listed = [s async for s in await client.list_schedules()]

    async def row(s) -> dict[str, Any]:
        memo = await s.memo() if s.raw_entry.HasField("memo") else {}
        info, sched = s.info, s.schedule
        last, view = await _last_check(client, info.recent_actions if info else [])
        return {
            "id": s.id, "paused": sched.state.paused if sched else None, "note": sched.state.note if sched else None,
            "spec": spec_text(sched.spec if sched else None, memo),
            "next_run": info.next_action_times[0].isoformat() if info and info.next_action_times else None,
            "last_run": last["scheduled_at"] if last else None,
            "last_check": view.as_json() if view else None,
        }
    return list(await asyncio.gather(*(row(s) for s in listed)))


def schedule_table(rows: list[dict[str, Any]]) -> list[list[str]]:
    def t(iso: str | None) -> str:
        return when(datetime.fromisoformat(iso)) if iso else "-"
    return [[r["id"], "paused" if r["paused"] else "active" if r["paused"] is not None else "?", r["spec"],
             t(r["next_run"]), t(r["last_run"]), r["last_check"]["decision"] if r["last_check"] else "-",  # whole: the table wraps it
             r["note"] or ""] for r in rows]


async def schedule_description(client: Client, schedule_id: str, recent: int = 5) -> dict[str, Any]:
    """One schedule: state, spec, the request it checks, next runs and its recent checks with their decisions."""
    from domain.models import RebuildCheckInput

    d = await client.get_schedule_handle(schedule_id).describe()
    memo = await d.memo() if d.raw_description.HasField("memo") else {}
    action, request = d.schedule.action, None
    args = getattr(action, "args", None)
    if args:
        try:
            request = (await client.data_converter.decode(list(args), [RebuildCheckInput]))[0].request
        except Exception:  # noqa: BLE001 - an action written by something else: show the rest
            request = None
    actions = sorted(d.info.recent_actions, key=lambda a: a.scheduled_at, reverse=True)[:recent]
    checks = []
    for a in actions:
        ex = a.action
        if isinstance(ex, ScheduleActionExecutionStartWorkflow):
            try:
                view = await oc.read_rebuild_check(client, ex.workflow_id, ex.first_execution_run_id)
            except oc.CommandError as e:
                view = oc.RebuildCheckView(workflow_id=ex.workflow_id, run_id=ex.first_execution_run_id,
                                           status="unknown", started_at=a.started_at, closed_at=None,
                                           error=e.message)
            checks.append({"scheduled_at": a.scheduled_at.isoformat(), **view.as_json()})
    return {
        "id": d.id, "paused": d.schedule.state.paused, "note": d.schedule.state.note,
        "spec": spec_text(d.schedule.spec, memo),
        "workflow_id_prefix": getattr(action, "id", None),
        "request": request.model_dump(mode="json") if request else None,
        "created_at": d.info.created_at.isoformat() if d.info.created_at else None,
        "num_actions": d.info.num_actions, "skipped_overlap": d.info.num_actions_skipped_overlap,
        "next_action_times": [t.isoformat() for t in d.info.next_action_times[:3]],
        "recent_actions": [c["workflow_id"] for c in checks],
        "recent_checks": checks,
    }


def schedule_text(desc: dict[str, Any]) -> str:
    """``schedule describe`` for people: what it checks, when, and what each recent check decided."""
    def t(iso: str | None) -> str:
        return when(datetime.fromisoformat(iso)) + " UTC" if iso else "-"
    req = desc["request"]
    lines = [f"schedule {desc['id']}: {'paused' if desc['paused'] else 'active'}",
             f"  runs:        {desc['spec']} (overlap: skip)",
             f"  note:        {desc['note'] or '-'}"]
    if req:
        cr = req.get("compatibility_request") or {}
        lines.append(f"  checks:      {', '.join(req['architectures'])} × {', '.join(req['variants'])}"
                     + (f"; requested by {cr.get('requested_by')}: {cr.get('reason')}" if cr else ""))
    lines += [f"  created:     {t(desc['created_at'])}; {desc['num_actions']} run(s) so far"
              + (f", {desc['skipped_overlap']} skipped (overlap)" if desc["skipped_overlap"] else ""),
              "  next runs:   " + (", ".join(t(x) for x in desc["next_action_times"]) or "- (paused or ended)")]
    if not desc["recent_checks"]:
        lines.append("  recent checks: none yet (`python starter.py schedule trigger "
                     f"{desc['id']}` runs one now)")
    else:
        lines.append("  recent checks (newest first):")
        for c in desc["recent_checks"]:
            lines.append(f"    {t(c['scheduled_at'])}  {c['workflow_id']}")
            lines.append(f"      {c['decision']}")
    return "\n".join(lines)


def rebuild_check_text(view: oc.RebuildCheckView) -> str:
    """``report`` of a rebuild check: its decision, why, the commits compared and what it started."""
    lines = [f"rebuild check {view.workflow_id}: {view.status}"
             + (f" (started {when(view.started_at)} UTC" + (f", ended {when(view.closed_at)} UTC)" if view.closed_at
                                                           else ")") if view.started_at else "")]
    res = view.result
    if res is None:
        lines.append(f"  {view.line()}")
        if view.status == "failed":
            lines.append("  next step: fix the cause named above; the schedule checks again at its next time "
                         "(or `python starter.py schedule trigger <schedule-id>`)")
        return "\n".join(lines)
    d = res.decision
    lines.append(f"  decision:  {'rebuild' if d.needed else 'no rebuild'} — {res.note}")
    lines.append(f"  source:    {d.source_commit} (last validated image: {d.last_source_commit or '-'})")
    lines.append(f"  harbor:    {d.harbor_commit} (last validated image: {d.last_harbor_commit or '-'})")
    for r in d.reasons:
        lines.append(f"  why:       {r}")
    if d.changed_paths:
        shown = ", ".join(d.changed_paths[:20]) + (f" and {len(d.changed_paths) - 20} more"
                                                   if len(d.changed_paths) > 20 else "")
        lines.append(f"  changed:   {shown}")
    if res.pipeline_workflow_id:
        lines.append(f"  pipeline:  {res.pipeline_workflow_id}"
                     + (f" (follow: python starter.py follow {res.pipeline_workflow_id})" if res.started
                        else " (not started by this check)"))
    return "\n".join(lines)
