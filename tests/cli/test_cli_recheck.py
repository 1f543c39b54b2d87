"""``recheck`` sends its signal only to a target that waits for one (a private package, a silent
registry); an unknown, finished or otherwise busy target is refused with exit 2, saying why and what
to run instead, and nothing is sent.

The pipeline and targets are stand-ins (workflows of the same types that set the same search
attributes and count the re-checks they receive), so no Iris job runs; Temporal and the CLI are real."""

from __future__ import annotations

import uuid

import pytest
from temporalio import workflow
from temporalio.worker import UnsandboxedWorkflowRunner, Worker

from domain.models import target_workflow_id
from domain.outcome import recheck_refusal
from tests.cli.starter_cli import minimal_config, starters

pytestmark = pytest.mark.stack


@workflow.defn(name="BuildPipelineWorkflow")
class StandInPipeline:
    @workflow.run
    async def run(self, _inp: dict) -> None:
        await workflow.wait_condition(lambda: False)


@workflow.defn(name="TargetBuildWorkflow")
class StandInTarget:
    """Shows the given stage and failure class, as TargetBuildWorkflow._set_stage does, and counts re-checks."""

    def __init__(self) -> None:
        self.rechecks = 0

    @workflow.run
    async def run(self, inp: dict) -> None:
        from runtime import search_attributes as sa

        workflow.upsert_search_attributes([sa.STAGE.value_set(inp["stage"])]
                                          + ([sa.FAILURE_CLASS.value_set(inp["class"])] if inp.get("class") else []))
        if inp["stage"] != "done":
            await workflow.wait_condition(lambda: False)

    @workflow.signal
    def recheck(self) -> None:
        self.rechecks += 1

    @workflow.query
    def received(self) -> int:
        return self.rechecks



TARGETS = {"amd64-standard": {"stage": "waiting", "class": "visibility"},
           "arm64-standard": {"stage": "waiting", "class": "validation_inconclusive"},
           "amd64-megatron": {"stage": "running"},
           "arm64-megatron": {"stage": "waiting", "class": "unknown"},
           "amd64-done": {"stage": "done"}}


async def test_recheck_is_sent_only_to_a_target_waiting_for_one(temporal_dev_server, temporal_client, tmp_path):
    queue = f"recheck-{uuid.uuid4().hex[:6]}"
    wid = f"gpu-rl-build-recheck-{uuid.uuid4().hex[:8]}"
    client = temporal_client
    async with Worker(client, task_queue=queue, workflows=[StandInPipeline, StandInTarget],
                      workflow_runner=UnsandboxedWorkflowRunner()):
        await client.start_workflow("BuildPipelineWorkflow", {}, id=wid, task_queue=queue)
        handles = {k: await client.start_workflow("TargetBuildWorkflow", v, id=target_workflow_id(wid, k),
                                                  task_queue=queue) for k, v in TARGETS.items()}
        await handles["amd64-done"].result()
        for key in TARGETS:  # every stand-in has run its first task (its search attributes are set)
            if key != "amd64-done":
                await handles[key].query("received")
        try:
            cfg = minimal_config(tmp_path, temporal_dev_server.address, queue)
            ran = dict(zip([*TARGETS, "nope"], await starters(cfg, *(("recheck", wid, k) for k in [*TARGETS, "nope"])),
                           strict=True))
            counts = {k: await handles[k].query("received") for k in TARGETS if k != "amd64-done"}
        finally:
            for key, h in handles.items():
                if key != "amd64-done":
                    await h.terminate()
            await client.get_workflow_handle(wid).terminate()
    assert ran["amd64-standard"].code == 0 and "re-check requested for amd64-standard" in ran["amd64-standard"].out
    assert ran["arm64-standard"].code == 0
    assert counts == {"amd64-standard": 1, "arm64-standard": 1, "amd64-megatron": 0, "arm64-megatron": 0}
    running, deciding, done, unknown = (ran[k] for k in ("amd64-megatron", "arm64-megatron", "amd64-done", "nope"))
    assert running.code == 2 and "amd64-megatron is not waiting for a re-check (stage running)" in running.err
    assert deciding.code == 2 and f"python starter.py decide {wid} arm64-megatron retry" in deciding.err
    assert done.code == 2 and "amd64-done has already finished (completed, stage done)" in done.err
    assert unknown.code == 2 and f"{wid} has no target 'nope'" in unknown.err
    for r in (running, deciding, done, unknown):
        assert r.err.startswith("error: ") and len(r.err.strip().splitlines()) == 1 and "Traceback" not in r.err


def test_the_refusal_rule():
    ok = {"running": True, "status": "running"}
    assert recheck_refusal("w", "t", stage="waiting", failure_class="visibility", **ok) is None
    assert recheck_refusal("w", "t", stage="waiting", failure_class="validation_inconclusive", **ok) is None
    assert "stage validating" in recheck_refusal("w", "t", stage="validating", failure_class=None, **ok)
    assert "decide w t retry" in recheck_refusal("w", "t", stage="waiting", failure_class="oom", **ok)
    assert "already finished (failed, stage failed)" in recheck_refusal(
        "w", "t", running=False, status="failed", stage="failed", failure_class="visibility")
