"""RebuildCheckWorkflow tells operators what it decided, in the UI's Current Details and by BuildKind:
a decision with its reasons and commits; a failed check with its cause and next step. Time-skipping
server, the real workflow, a stand-in decision activity (the real one runs in tests/rebuild)."""

from __future__ import annotations

import uuid

from temporalio import activity
from temporalio.client import WorkflowFailureError
from temporalio.exceptions import ApplicationError
from temporalio.worker import Worker

from domain.models import RebuildCheckInput, RebuildCheckResult, RebuildDecision
from runtime import search_attributes as sa
from tests.workflows.standins import request, result
from tests.workflows.test_terminal_outcomes import details
from workflows.rebuild import RebuildCheckWorkflow

SRC, HARBOR, LAST = "a" * 40, "b" * 40, "c" * 40


def _worker(client, tq: str, decide) -> Worker:
    @activity.defn(name="rebuild_decision")
    async def rebuild_decision(inp: RebuildCheckInput) -> RebuildDecision:
        return decide()

    return Worker(client, task_queue=tq, workflows=[RebuildCheckWorkflow], activities=[rebuild_decision])


async def _run(env, decide):
    u = uuid.uuid4().hex[:8]
    tq, wid = f"tq-{u}", f"rebuild-check-details-{u}"
    async with _worker(env.client, tq, decide):
        handle = await env.client.start_workflow(
            RebuildCheckWorkflow.run, RebuildCheckInput(request=request(), start_pipeline=False), id=wid,
            task_queue=tq, result_type=RebuildCheckResult)
        try:
            res = await result(handle)
        except WorkflowFailureError as e:
            res = e
        return handle, res, await details(handle)


async def test_a_decision_shows_with_its_reasons_commits_and_kind(time_skipping_env):
    decision = RebuildDecision(needed=False, reasons=["only cloud/iris/ changed: no rebuild"], source_commit=SRC,
                               harbor_commit=HARBOR, last_source_commit=LAST, last_harbor_commit=HARBOR,
                               changed_paths=["cloud/iris/gpu_rl_images.py"])
    handle, res, shown = await _run(time_skipping_env, lambda: decision)
    assert isinstance(res, RebuildCheckResult) and res.note == "no rebuild needed"
    assert "decision **no rebuild**" in shown and "only cloud/iris/ changed: no rebuild" in shown, shown
    assert f"| source | `{SRC[:12]}` | `{LAST[:12]}` |" in shown and "`cloud/iris/gpu_rl_images.py`" in shown
    # Started without BuildKind (as a schedule created before it existed would): tagged itself.
    assert (await handle.describe()).typed_search_attributes.get(sa.KIND) == "rebuild-check"


async def test_a_failed_check_shows_its_cause_and_next_step(time_skipping_env):
    def refuse():
        raise ApplicationError("git ls-remote: repository not found: MarinSkyRL", type="NotFound", non_retryable=True)

    _handle, res, shown = await _run(time_skipping_env, refuse)
    assert isinstance(res, WorkflowFailureError)
    assert "**Rebuild check** — **failed**" in shown and "NotFound: git ls-remote: repository not found" in shown
    assert "**Next step:**" in shown and "schedule trigger" in shown


def test_decision_line_names_what_it_did_and_why():
    from domain import outcome

    res = RebuildCheckResult(decision=RebuildDecision(needed=True, reasons=["harbor moved"], source_commit=SRC,
                                                      harbor_commit=HARBOR, last_source_commit=SRC,
                                                      last_harbor_commit=LAST),
                             pipeline_workflow_id="gpu-rl-build-x", started=True, note="started gpu-rl-build-x")
    assert outcome.rebuild_decision(res) == "rebuild — harbor moved — started gpu-rl-build-x"


def test_schedule_list_shows_the_deciding_reason_first_and_whole():
    from domain import outcome
    from runtime import listing

    deciding = ("skyrl-train/skyrl_train/config/ppo_base_config.yaml: matches `skyrl-train/**` "
                "(.agents/ops/gpu-rl-image-build.md:16) → image rebuild required (amd64-megatron, since its pin at "
                "0123456789ab)")
    res = RebuildCheckResult(decision=RebuildDecision(
        needed=True, reasons=[deciding, "cloud/iris/x.yaml: matches `cloud/iris/**` → no rebuild"],
        source_commit=SRC, harbor_commit=HARBOR, last_source_commit=None, last_harbor_commit=LAST,
        rebuild_targets=["amd64-megatron"]), pipeline_workflow_id="gpu-rl-build-x", started=True,
        note="started gpu-rl-build-x")
    line = outcome.rebuild_decision(res)
    assert line.startswith(f"rebuild — {deciding} — started gpu-rl-build-x")
    row = {"id": "nightly", "paused": False, "note": "", "spec": "every 24h", "next_run": None, "last_run": None,
           "last_check": {"decision": line}}
    assert listing.schedule_table([row])[0][5] == line  # whole: the table wraps it, never cuts it
