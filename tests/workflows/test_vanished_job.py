"""Domain §11.4: a job the controller no longer knows is never a success on absence alone.
The registry decides: our tag with our revision labels (and a complete log) → recovered; otherwise the
target is resubmitted under a new name as worker loss."""

from __future__ import annotations

import uuid

from temporalio import activity

from domain.models import TargetResult, ValidateInput
from domain.validation import CheckResult, ValidationReport
from tests.workflows.standins import Round, Standins, result, target_input, validation, worker
from workflows.target import TargetBuildWorkflow

KEY = "amd64-standard"


class LabelledRegistry(Standins):
    """The registry already holds the tag, with labels naming the build inputs."""

    @activity.defn(name="validate_image")
    async def validate_image(self, inp: ValidateInput) -> ValidationReport:
        await self._enter("validate_image", inp)
        report = validation(inp.target, "pass")
        labels = [CheckResult(name="label:org.opencontainers.image.revision", expected=inp.build_commit,
                              observed=inp.build_commit, verdict="pass")]
        return report.model_copy(update={"checks": [*report.checks, *labels]})


async def _run(env, s: Standins) -> TargetResult:
    u = uuid.uuid4().hex[:8]
    wid, tq = f"wf-vanish-{u}", f"tq-{u}"
    async with worker(env.client, tq, s):
        return await result(await env.client.start_workflow(TargetBuildWorkflow.run, target_input(wid), id=wid,
                                                            task_queue=tq))


async def test_vanished_job_with_our_image_in_the_registry_is_recovered_without_resubmitting(time_skipping_env):
    s = LabelledRegistry(rounds={KEY: [Round(state="missing")]})
    res = await _run(time_skipping_env, s)
    assert res.status == "validated" and len(res.job_ids) == 1 and not res.failures
    assert "recovered from the registry" in res.message
    assert len(s.names("submit_job")) == 1 and s.names("check_build_log")


async def test_vanished_job_without_a_matching_image_is_resubmitted_as_worker_loss(time_skipping_env):
    s = Standins(rounds={KEY: [Round(state="missing"), Round()]})  # the registry report carries no labels
    res = await _run(time_skipping_env, s)
    assert res.status == "validated" and len(res.job_ids) == 2 and res.job_ids[1].endswith("-r1")
    (f,) = res.failures
    assert f.failure_class == "worker_loss" and f.decision == "retry" and "vanished" in f.reasons[0]
