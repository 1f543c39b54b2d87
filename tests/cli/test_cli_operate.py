"""One real sandbox build driven only through ``starter.py``, the way an operator runs it.

One build serves every assertion (a build costs about a minute): start, attach, follow + Ctrl-C +
follow again, status by search attribute, decide refused, report in both formats, recheck after the
visibility flip, approve-merge refused while CI is pending, then authorized; afterwards the schedule
commands, whose triggered rebuild check must find nothing to rebuild right after the merge.
"""

from __future__ import annotations

import json
import uuid

import pytest

from domain.models import PipelineReport, RebuildCheckResult, target_workflow_id
from sandbox.stack import MARINSKYRL_SLUG
from tests.cli.starter_cli import Follower, starter, starters
from tests.e2e.helpers import (
    awaiting_merge,
    report,
    target_status,
    wait_until,
    waiting_on_visibility,
)

pytestmark = pytest.mark.stack

KEY = "amd64-standard"
BUILD = ("build", "--arch", "amd64", "--variant", "standard", "--cluster", "amd64=sandbox-amd64",
         "--requested-by", "tester", "--reason", "cli operate test")


def _workflow_id(out: str) -> str:
    first = out.splitlines()[0]
    assert first.startswith("workflow: "), out
    return first.removeprefix("workflow: ").split()[0]


async def _runs_of(client, wid: str) -> list[str]:
    return [wf.run_id async for wf in client.list_workflows(f"WorkflowId = '{wid}'")]


async def test_operator_drives_one_build_end_to_end_through_the_cli(service_stack):
    s = service_stack
    cfg = s.config_path
    followers: list[Follower] = []
    try:
        # build, then build again for the same commits: the second attaches to the same pipeline.
        first = await starter(cfg, *BUILD)
        assert first.code == 0, first.text
        wid = _workflow_id(first.out)
        assert "attached" not in first.out
        run_id = (await s.client.get_workflow_handle(wid).describe()).run_id
        second = await starter(cfg, *BUILD)
        assert second.code == 0, second.text
        assert _workflow_id(second.out) == wid  # the "(attached ...)" wording: see test_cli_attach.py
        assert (await s.client.get_workflow_handle(wid).describe()).run_id == run_id
        assert await wait_until(lambda: _runs_of(s.client, wid), what="visibility of the run") == [run_id]

        # follow prints progress; Ctrl-C mid-build leaves the pipeline running.
        f1 = await Follower.start(cfg, "follow", wid, "--interval", "1")
        followers.append(f1)
        await f1.read_until(lambda line: line.startswith(f"  {KEY}: ") and " job " in line)
        assert f1.lines[0].startswith(f"following {wid}") and f1.lines[1].startswith("[") and wid in f1.lines[1]
        assert await f1.interrupt() != 0
        assert "done" not in f1.output and "merged" not in f1.output
        assert (await s.client.get_workflow_handle(wid).describe()).status.name == "RUNNING"

        # Green build, private package: the target waits; status finds it by its search attribute.
        await wait_until(lambda: waiting_on_visibility(s.client, wid, KEY), what="visibility wait")
        row = await wait_until(lambda: _status_row(cfg, target_workflow_id(wid, KEY)), what="status lists the waiting target")
        assert (row["status"], row["stage"], row["failure_class"], row["kind"]) == ("running", "waiting", "visibility", "build")

        # Three answers that change nothing, asked side by side and checked one by one.
        refused, as_json, as_md = await starters(cfg, ("decide", wid, KEY, "retry", "--by", "tester"),
                                                 ("report", wid, "--format", "json"),
                                                 ("report", wid, "--format", "markdown"))
        assert refused.code == 2  # a refusal, like recheck's (issue 38: it answered 1)
        assert "refused" in refused.err and "not waiting for an operator decision" in refused.err

        assert as_json.code == 0, as_json.text
        rep = PipelineReport.model_validate(json.loads(as_json.out))
        assert rep.workflow_id == wid and rep.status == "running" and [t.key for t in rep.plan] == [KEY]
        assert as_md.code == 0 and as_md.out.startswith(f"# GPU-RL build `{wid}` — running")
        assert rep.source.build_commit in as_md.out

        # The operator flips visibility and asks for a re-check (no rebuild).
        job_ids = (await target_status(s.client, wid, KEY)).job_ids
        s.token_registry.set_public(s.image_repo_path, True)
        rechecked = await starter(cfg, "recheck", wid, KEY)
        assert rechecked.code == 0 and f"re-check requested for {KEY}" in rechecked.out

        # PR open, CI pending: approve-merge is accepted at once and queued; a second follow runs to the end
        # meanwhile; the merge follows CI turning green without a second command.
        rep = await wait_until(lambda: awaiting_merge(s.client, wid), what="awaiting_merge")
        f2 = await Follower.start(cfg, "follow", wid, "--interval", "1")
        followers.append(f2)
        approved = await starter(cfg, "approve-merge", wid, "--by", "tester")
        assert approved.code == 0 and "merge authorized by tester (config:operators.logins" in approved.out
        assert "accepted and queued" in approved.out, approved.text
        s.github.set_check(MARINSKYRL_SLUG, rep.pull_request.head_sha, "ci")

        assert await f2.finish() == 0, f2.output + f2.err
        final = await report(s.client, wid)
        assert final.status == "merged" and final.merge_commit
        # follow ends with a few-line summary (issue 38): the outcome line names the merge commit
        assert f"merged: {wid}" in f2.output and f"merge commit {final.merge_commit[:12]}" in f2.output
        assert final.targets[0].job_ids == job_ids, "the re-check must not rebuild"
        # `report` once the pipeline has closed replays its history on the worker (see the final report).

        await _schedule_lifecycle(s, cfg)
    finally:
        for f in followers:
            f.stop()


async def _schedule_lifecycle(s, cfg) -> None:
    sid = f"cli-test-{uuid.uuid4().hex[:8]}"
    created = await starter(cfg, "schedule", "create", sid, "--every", "24", "--arch", "amd64",
                            "--cluster", "amd64=sandbox-amd64",
                            "--variant", "standard", "--requested-by", "tester", "--reason", "nightly check")
    assert created.code == 0 and f"schedule {sid} created" in created.out, created.text
    try:
        # `schedule list` is covered by test_cli_schedule.py (it needs no build).
        assert (await _describe(cfg, sid))["paused"] is False

        assert (await starter(cfg, "schedule", "pause", sid)).code == 0
        assert (await _describe(cfg, sid))["paused"] is True
        assert (await starter(cfg, "schedule", "unpause", sid)).code == 0
        assert (await _describe(cfg, sid))["paused"] is False

        # Trigger now: the check runs on the worker and, right after the merge, finds nothing to rebuild
        # (only the pin table changed, which reaches the cluster without a rebuild).
        assert (await starter(cfg, "schedule", "trigger", sid)).code == 0
        actions = await wait_until(lambda: _recent_actions(cfg, sid), what="triggered action", timeout=60)
        assert len(actions) == 1 and actions[0].startswith(f"rebuild-check-{sid}")
        check = await s.client.get_workflow_handle(actions[0], result_type=RebuildCheckResult).result()
        assert check.decision.needed is False and not check.started, check

        deleted = await starter(cfg, "schedule", "delete", sid)
        assert deleted.code == 0
        gone = await starter(cfg, "schedule", "describe", sid)
        assert gone.code == 1 and f"schedule {sid}" in gone.err
    finally:
        await starter(cfg, "schedule", "delete", sid)  # idempotent cleanup on the shared server


async def _describe(cfg, sid) -> dict:
    ran = await starter(cfg, "schedule", "describe", sid, "--json")
    assert ran.code == 0, ran.text
    return json.loads(ran.out)


async def _recent_actions(cfg, sid) -> list[str]:
    return (await _describe(cfg, sid))["recent_actions"]


async def _status_row(cfg, workflow_id: str) -> dict | None:
    ran = await starter(cfg, "status", "--query", "BuildStage = 'waiting'", "--limit", "200", "--json")
    assert ran.code == 0, ran.text
    return next((row for row in json.loads(ran.out) if row["workflow_id"] == workflow_id), None)


