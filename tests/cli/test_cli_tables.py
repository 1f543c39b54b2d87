"""Operator answers in text, with ``--json`` beside them, on the real stack through ``starter.py``:

- ``status``: a table with headers and times; by default builds only (BuildKind = 'build'), so a plan
  and a schedule's validation stay out of it; ``--all`` lists them with their kind.
- ``schedule list``: a table (state, how often, next/last run, last check's decision); ``schedule
  describe``: text (``--json`` keeps JSON).
- a rebuild check's decision and reason: in ``report``, ``schedule describe`` and its Current Details.

One schedule serves all: its validation is a plan (kind ``validation``), its triggered check finds the
fixture's made-up pinned commit and starts a build (kind ``build``, tagged by the pipeline itself), which
is terminated once listed.
"""

from __future__ import annotations

import json
import re
import uuid

import pytest
from temporalio.api.sdk.v1 import WorkflowMetadata

from domain.models import RebuildCheckResult
from tests.cli.starter_cli import starter, starters
from tests.e2e.helpers import wait_until
from tests.rebuild.helpers import stop_pipeline

pytestmark = pytest.mark.stack

TIME = r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d"
PLAN = ("build", "--plan", "--arch", "amd64", "--variant", "standard", "--cluster", "amd64=sandbox-amd64",
        "--requested-by", "tester", "--reason", "tables test")


def _header_and_rows(out: str) -> tuple[list[str], list[str]]:
    lines = [line for line in out.splitlines() if line.strip()]
    return re.split(r"\s{2,}", lines[0].strip()), lines[1:]


async def _json(cfg, *args) -> list | dict:
    ran = await starter(cfg, *args, "--json")
    assert ran.code == 0, ran.text
    return json.loads(ran.out)


async def test_status_and_schedules_answer_in_tables_and_text(service_stack):
    s = service_stack
    cfg = s.config_path
    sid = f"cli-tables-{uuid.uuid4().hex[:8]}"
    pipeline = None
    planned = await starter(cfg, *PLAN)
    assert planned.code == 0, planned.text
    plan_id = planned.out.splitlines()[0].removeprefix("workflow: ").split()[0]
    assert plan_id.endswith("-plan")
    created = await starter(cfg, "schedule", "create", sid, "--every", "24", "--arch", "amd64", "--variant",
                            "standard", "--cluster", "amd64=sandbox-amd64", "--requested-by", "tester",
                            "--reason", "tables test", "--note", "nightly check")
    assert created.code == 0, created.text
    try:
        validation_id = f"{plan_id}-schedule-{sid}"
        assert (await starter(cfg, "schedule", "trigger", sid)).code == 0

        async def checked():
            desc = await _json(cfg, "schedule", "describe", sid)
            done = [c for c in desc["recent_checks"] if c["status"] == "completed"]
            return desc if done else None
        desc = await wait_until(checked, what="the triggered check completed", timeout=120)
        check = desc["recent_checks"][0]
        result = RebuildCheckResult.model_validate(check["result"])
        assert result.decision.needed and result.started, result  # the fixture pins a made-up commit
        pipeline = s.client.get_workflow_handle(result.pipeline_workflow_id)
        assert desc["recent_actions"] == [check["workflow_id"]] and desc["spec"] == "every 24h"

        # status: builds only by default (the pipeline the check started tagged itself 'build').
        ours = (f"WorkflowId = '{pipeline.id}' OR WorkflowId = '{plan_id}' OR WorkflowId = '{validation_id}' "
                f"OR WorkflowId = '{check['workflow_id']}'")

        async def kinds(*flags):
            rows = await _json(cfg, "status", "--query", ours, "--limit", "50", *flags)
            found = {r["workflow_id"]: r["kind"] for r in rows}
            return found if len(found) == (4 if flags else 1) else None
        assert await wait_until(lambda: kinds(), what="default status lists the build only", timeout=60) == {
            pipeline.id: "build"}
        assert await wait_until(lambda: kinds("--all"), what="--all lists every kind", timeout=60) == {
            pipeline.id: "build", plan_id: "plan", validation_id: "validation", check["workflow_id"]: "rebuild-check"}

        # The read-only answers below do not depend on each other: asked side by side, checked one by one.
        table, everything, listed, listed_json, text, rep, rep_json = await starters(
            cfg, ("status", "--limit", "1000"),  # the default query, as a table (not a TTY)
            ("status", "--all", "--limit", "1000"), ("schedule", "list"), ("schedule", "list", "--json"),
            ("schedule", "describe", sid), ("report", check["workflow_id"]),
            ("report", check["workflow_id"], "--format", "json"))
        assert table.code == 0, table.text
        header, rows = _header_and_rows(table.out)
        assert header == ["WORKFLOW", "KIND", "STATUS", "STAGE", "FAILURE CLASS", "STARTED (UTC)", "ENDED (UTC)",
                          "DURATION", "WAITING FOR"]
        row = next(r for r in rows if r.startswith(pipeline.id + " "))
        assert re.search(rf"\sbuild\s+running\s+\S+\s+-\s+{TIME}\s+\(running\)\s+\d+m\d\ds\s+\S.*$", row), row
        assert plan_id not in table.out and validation_id not in table.out  # kept out of the build list
        assert plan_id in everything.out and check["workflow_id"] in everything.out

        # schedule list: a table; --json the same rows.
        assert listed.code == 0, listed.text
        header, rows = _header_and_rows(listed.out)
        assert header == ["SCHEDULE", "STATE", "RUNS", "NEXT RUN (UTC)", "LAST RUN (UTC)", "LAST CHECK", "NOTE"]
        row = next(r for r in rows if r.startswith(sid + " "))
        assert re.search(rf"^{sid}\s+active\s+every 24h\s+{TIME}\s+{TIME}\s+rebuild — \S.* — started {pipeline.id}", row), row  # the deciding reason first (issue 39)
        assert row.endswith("nightly check")
        assert listed_json.code == 0, listed_json.text
        as_json = next(r for r in json.loads(listed_json.out) if r["id"] == sid)
        assert as_json["paused"] is False and as_json["last_check"]["workflow_id"] == check["workflow_id"]
        assert as_json["next_run"] and as_json["last_run"]

        # schedule describe: text, with what each recent check decided and why.
        assert text.code == 0, text.text
        assert text.out.startswith(f"schedule {sid}: active\n"), text.out
        assert "  runs:        every 24h (overlap: skip)" in text.out
        assert "  checks:      amd64 × standard; requested by tester: tables test" in text.out
        assert re.search(rf"\n    {TIME} UTC  {re.escape(check['workflow_id'])}\n      rebuild — .*provenance.* — "
                         rf"started {pipeline.id}", text.out), text.out  # the deciding reason first (issue 39)
        assert not text.out.lstrip().startswith("{")

        # report accepts the rebuild check and prints its decision; Current Details say the same.
        assert rep.code == 0, rep.text
        assert rep.out.startswith(f"rebuild check {check['workflow_id']}: completed (started ")
        assert f"  decision:  rebuild — started {pipeline.id}" in rep.out and "  why:       " in rep.out
        assert f"(follow: python starter.py follow {pipeline.id})" in rep.out
        rep_json = json.loads(rep_json.out)
        assert RebuildCheckResult.model_validate(rep_json["result"]) == result
        meta = await s.client.get_workflow_handle(check["workflow_id"]).query(
            "__temporal_workflow_metadata", result_type=WorkflowMetadata)
        assert "decision **rebuild**" in meta.current_details and pipeline.id in meta.current_details
        assert "**Why:**" in meta.current_details and "provenance" in meta.current_details

        assert (await starter(cfg, "schedule", "pause", sid)).code == 0
        paused = await wait_until(lambda: _row_state(cfg, sid, "paused"), what="paused listed", timeout=30)
        assert paused
    finally:
        if pipeline is not None:
            await stop_pipeline(pipeline)
        await starter(cfg, "schedule", "delete", sid)


async def _row_state(cfg, sid: str, state: str) -> bool:
    listed = await starter(cfg, "schedule", "list")
    return any(re.match(rf"^{sid}\s+{state}\s", line) for line in listed.out.splitlines())
