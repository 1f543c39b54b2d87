"""A PR closed by hand on real parts (issue #28.1): Temporal dev server, Iris, registry, git, the GitHub
stand-in. The build ends at once as the operator expects — `starter.py report` and `status` say it was
closed, by whom, and what to do — and the next step it prints, run as written after re-opening the PR,
finishes the build on the same PR without rebuilding anything."""

from __future__ import annotations

import json
import shlex

import pytest
from temporalio.client import WorkflowFailureError

from domain.models import MergeAuthorization, PipelineReport
from sandbox.stack import MARINSKYRL_SLUG
from tests.cli.starter_cli import starters
from tests.e2e.helpers import awaiting_merge, checks_green, request, start_pipeline, wait_until

pytestmark = pytest.mark.stack
ALICE = "alice-token-not-a-secret"


async def test_a_pr_closed_by_hand_ends_the_build_and_its_next_step_finishes_it_on_the_reopened_pr(service_stack):
    s = service_stack
    s.token_registry.set_public(s.image_repo_path, True)  # no visibility wait
    s.github.add_token(ALICE, "alice")
    handle = await start_pipeline(s, request())
    rep = await wait_until(lambda: awaiting_merge(s.client, handle.id), timeout=300, what="PR opened")
    number, jobs = rep.pull_request.number, rep.targets[0].job_ids
    status, _ = s.github.api("PATCH", f"/repos/{MARINSKYRL_SLUG}/pulls/{number}", {"state": "closed"}, token=ALICE)
    assert status == 200
    with pytest.raises(WorkflowFailureError):
        await handle.result()

    (shown,) = await starters(s.config_path, ("report", handle.id, "--format", "json"))
    assert shown.code == 1, shown.text  # ended without merging: exit 1, like any build that did not finish
    rep = PipelineReport.model_validate_json(shown.out)
    assert rep.status == "cancelled" and rep.failure.failure_class == "pr_closed"
    assert f"PR #{number}" in rep.failure.message and "by alice" in rep.failure.message

    async def listed():  # `status` reads visibility, which follows the workflow's last upsert shortly after
        (ran,) = await starters(s.config_path, ("status", "--json", "--query", f"WorkflowId = '{handle.id}'"))
        rows = json.loads(ran.out) if ran.code == 0 else []
        return rows and rows[0]["failure_class"] == "pr_closed" and rows[0]
    row = await wait_until(listed, what="status listing the closed build")
    assert (row["stage"], row["status"]) == ("cancelled", "failed"), row

    # The next step, as written: re-open the PR, then the resume command.
    assert s.github.api("PATCH", f"/repos/{MARINSKYRL_SLUG}/pulls/{number}", {"state": "open"}, token=ALICE)[0] == 200
    command = rep.failure.next_step.split("`")[1]
    assert command == f"python starter.py resume {handle.id}"
    (ran,) = await starters(s.config_path, tuple(shlex.split(command)[2:]))
    assert ran.code == 0, ran.text
    rep = await wait_until(lambda: awaiting_merge(s.client, handle.id), timeout=300, what="resumed run awaiting merge")
    assert rep.pull_request.number == number and rep.targets[0].adopted_from and rep.targets[0].job_ids == jobs
    s.github.set_check(MARINSKYRL_SLUG, rep.pull_request.head_sha, "ci")
    await wait_until(lambda: checks_green(s.client, handle.id), what="checks green")
    resumed = s.client.get_workflow_handle(handle.id, result_type=PipelineReport)
    await resumed.execute_update("approve_merge", MergeAuthorization(by="tester"), result_type=str)
    final: PipelineReport = await resumed.result()
    assert final.status == "merged" and final.pull_request.number == number
