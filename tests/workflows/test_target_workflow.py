"""TargetBuildWorkflow decisions on scripted outcomes: retry by class, refuse to retry, ask the operator,
wait for package visibility. Time-skipping server, real workflow code, stand-in activities."""

from __future__ import annotations

import asyncio
import uuid

import pytest
from temporalio.client import WorkflowFailureError, WorkflowUpdateFailedError
from temporalio.exceptions import ApplicationError

from domain.config import PolicySettings
from domain.models import OperatorDecision, Stage, TargetResult, TargetStatus
from runtime import search_attributes as sa
from tests.workflows.standins import (
    MANIFEST_MISMATCH,
    PREEMPTED,
    UNKNOWN,
    Round,
    Standins,
    eventually,
    result,
    target_input,
    worker,
)
from workflows.target import TargetBuildWorkflow

KEY = "amd64-standard"


def _ids() -> tuple[str, str]:
    u = uuid.uuid4().hex[:8]
    return f"wf-test-{u}", f"tq-{u}"


async def _start(env, standins: Standins, tq: str, wid: str):
    return await env.client.start_workflow(TargetBuildWorkflow.run, target_input(wid), id=wid, task_queue=tq)


async def _failure(handle) -> tuple[ApplicationError, TargetResult]:
    with pytest.raises(WorkflowFailureError) as info:
        await result(handle)
    cause = info.value.cause
    assert isinstance(cause, ApplicationError), cause
    return cause, TargetResult.model_validate(cause.details[0])


async def _status(handle) -> TargetStatus:
    return await handle.query(TargetBuildWorkflow.status)


async def _done(handle) -> bool:
    return (await _status(handle)).stage == Stage.DONE


async def _waiting(handle) -> TargetStatus | None:
    st = await _status(handle)
    return st if st.stage == Stage.WAITING else None


async def test_preempted_attempt_is_resubmitted_once_under_a_new_name_then_succeeds(time_skipping_env):
    wid, tq = _ids()
    s = Standins(rounds={KEY: [Round(state="worker_failed", evidence=PREEMPTED), Round()]})
    async with worker(time_skipping_env.client, tq, s):
        res: TargetResult = await result(await _start(time_skipping_env, s, tq, wid))

    assert res.status == "validated" and res.digest and res.digest.startswith("sha256:")
    assert [i.round for i in s.names("submit_job")] == [0, 1]
    assert len(res.job_ids) == 2 and res.job_ids == s.submitted and res.job_ids[1].endswith("-r1")
    assert res.job_ids[1].removesuffix("-r1")[-8:] == res.job_ids[0][-8:]  # same generation, next round
    assert len(res.failures) == 1
    f = res.failures[0]
    assert (f.failure_class, f.decision, f.job_id) == ("preemption", "retry", res.job_ids[0])
    assert any("EvictedDueToPreempted" in r for r in f.reasons)
    # Each job was registered once with the cluster watcher and its terminal state came as a wake-up:
    # no polling activity per interval.
    assert [(w.job_id, w.known) for w in s.names("watch_job")] == [(j, None) for j in res.job_ids]
    assert s.names("monitor_job") == []
    assert len(s.names("validate_image")) == 1


async def test_input_error_fails_without_retry_naming_class_evidence_and_next_step(time_skipping_env):
    wid, tq = _ids()
    s = Standins(rounds={KEY: [Round(state="failed", evidence=MANIFEST_MISMATCH)]})
    async with worker(time_skipping_env.client, tq, s):
        handle = await _start(time_skipping_env, s, tq, wid)
        cause, res = await _failure(handle)
        status = await _status(handle)

    assert cause.type == "TargetFailed" and cause.non_retryable
    job = res.job_ids[0]
    diagnostics = res.failures[0].diagnostics.uri
    assert "input_error" in cause.message and job in cause.message and "MANIFEST mismatch" in cause.message
    assert f"evidence: {diagnostics}" in cause.message
    assert "next step: Bad template or inputs" in cause.message
    assert len(s.names("submit_job")) == 1 and res.status == "failed"
    assert [f.decision for f in res.failures] == ["fail"]
    assert s.names("validate_image") == []
    assert status.stage == Stage.FAILED and status.failure_class == "input_error"


async def test_missing_marker_is_an_assertion_failure_that_names_the_marker(time_skipping_env):
    wid, tq = _ids()
    marker = "validate-gpu-rl-stack OK"
    s = Standins(rounds={KEY: [Round(state="succeeded", missing=[marker])]})
    async with worker(time_skipping_env.client, tq, s):
        cause, res = await _failure(await _start(time_skipping_env, s, tq, wid))

    assert [c.missing_markers for c in s.names("capture_failure")] == [[marker]]
    assert "assertion_failure" in cause.message and f"missing marker: {marker}" in cause.message
    assert res.log_check is not None and res.log_check.missing == [marker]
    assert len(s.names("submit_job")) == 1 and s.names("validate_image") == []


async def test_succeeded_job_without_final_push_is_not_a_success(time_skipping_env):
    """A succeeded Iris job whose log never shows the final push is judged, not trusted."""
    wid, tq = _ids()
    s = Standins(rounds={KEY: [Round(state="succeeded", final_push=False, evidence=UNKNOWN)]},
                 policy=PolicySettings(operator_decision_timeout_s=60))
    async with worker(time_skipping_env.client, tq, s):
        cause, res = await _failure(await _start(time_skipping_env, s, tq, wid))
    assert len(s.names("capture_failure")) == 1 and s.names("validate_image") == []
    assert res.status == "failed"


async def test_unknown_failure_waits_for_operator_and_retry_resubmits(time_skipping_env):
    wid, tq = _ids()
    s = Standins(rounds={KEY: [Round(state="failed", evidence=UNKNOWN), Round()]})
    s.hold["policy"] = gate = asyncio.Event()
    async with worker(time_skipping_env.client, tq, s):
        handle = await _start(time_skipping_env, s, tq, wid)
        await eventually(lambda: _entered(s, "policy"), what="policy called")
        # Not waiting yet: a decision is refused by the validator (and leaves no trace in history).
        with pytest.raises(WorkflowUpdateFailedError) as early:
            await handle.execute_update(TargetBuildWorkflow.decide, OperatorDecision(action="retry"))
        assert "not waiting for an operator decision" in str(early.value.cause)
        gate.set()

        st = await eventually(lambda: _waiting(handle), what="waiting for operator")
        assert st.failure_class == "unknown"
        w = st.waiting
        assert w and w.kind == "operator_decision" and w.target == KEY and st.job_ids[0] in w.detail
        assert w.command == f"python starter.py decide {wid} {KEY} retry --by <your-name>"
        assert len(s.names("submit_job")) == 1
        # #21.5: the worker checks the name against the configured operators; an unlisted one is refused.
        with pytest.raises(WorkflowUpdateFailedError) as unlisted:
            await handle.execute_update(TargetBuildWorkflow.decide, OperatorDecision(action="abort", by="mallory"))
        assert unlisted.value.cause.type == "NotAuthorized" and "mallory: not a configured operator" in str(
            unlisted.value.cause)
        assert (await handle.query(TargetBuildWorkflow.status)).waiting is not None  # still waiting
        ack = await handle.execute_update(TargetBuildWorkflow.decide, OperatorDecision(action="retry", by="ana"))
        assert ack == (f"retry accepted for {KEY} (by ana, config:operators.logins; "
                       f"Temporal identity {time_skipping_env.client.identity})")
        res: TargetResult = await result(handle)

    assert res.status == "validated"
    assert [i.round for i in s.names("submit_job")] == [0, 1]
    assert [(f.failure_class, f.decision) for f in res.failures] == [("unknown", "retry")]
    assert [(a.kind, a.by, a.detail) for a in s.names("authorize_operator")] == [
        ("decide", "mallory", f"{KEY} abort"), ("decide", "ana", f"{KEY} retry")]
    history = await handle.fetch_history()
    # Both reached the handler (the refusal is the worker's check, recorded), only ana's decided.
    assert sum(1 for e in history.events if e.HasField("workflow_execution_update_accepted_event_attributes")) == 2


async def test_unknown_failure_abort_ends_aborted(time_skipping_env):
    wid, tq = _ids()
    s = Standins(rounds={KEY: [Round(state="failed", evidence=UNKNOWN)]})
    async with worker(time_skipping_env.client, tq, s):
        handle = await _start(time_skipping_env, s, tq, wid)
        await eventually(lambda: _waiting(handle), what="waiting for operator")
        await handle.execute_update(TargetBuildWorkflow.decide, OperatorDecision(action="abort", by="ana"))
        cause, res = await _failure(handle)
        # After the decision the update is refused again: nothing is waiting any more.
        with pytest.raises(Exception):  # noqa: B017,PT011 - closed workflow or refused update
            await handle.execute_update(TargetBuildWorkflow.decide, OperatorDecision(action="retry"))

    assert res.status == "aborted" and [f.decision for f in res.failures] == ["abort"]
    assert cause.type == "TargetFailed" and "unknown failure" in cause.message
    assert len(s.names("submit_job")) == 1


async def test_unknown_failure_without_decision_times_out_and_fails(time_skipping_env):
    wid, tq = _ids()
    s = Standins(rounds={KEY: [Round(state="failed", evidence=UNKNOWN)]})  # default timeout: 24 h
    async with worker(time_skipping_env.client, tq, s):
        handle = await _start(time_skipping_env, s, tq, wid)
        before = await time_skipping_env.get_current_time()
        cause, res = await _failure(handle)  # time skips over the operator timer
        after = await time_skipping_env.get_current_time()

    assert res.status == "failed" and [f.decision for f in res.failures] == ["fail"]
    assert len(s.names("submit_job")) == 1
    assert (after - before).total_seconds() >= PolicySettings().operator_decision_timeout_s


async def test_private_package_waits_then_recheck_signal_revalidates_without_rebuilding(time_skipping_env):
    wid, tq = _ids()
    s = Standins(validations={KEY: ["blocked", "pass"]})
    async with worker(time_skipping_env.client, tq, s):
        handle = await _start(time_skipping_env, s, tq, wid)
        st = await eventually(lambda: _waiting(handle), what="waiting on visibility")
        assert st.waiting and st.waiting.kind == "package_visibility"
        assert "not anonymously pullable" in st.waiting.detail
        assert st.waiting.command == f"python starter.py recheck {wid} {KEY}"
        assert await _search_attribute(handle, sa.FAILURE_CLASS) == "visibility"  # the wait is published
        await handle.signal(TargetBuildWorkflow.recheck)
        # Wait by query, not by result(): awaiting a result unlocks the test server's time skipping,
        # which may then fire the slow timer before the worker has picked up the signal.
        await eventually(lambda: _done(handle), what="validated after the recheck")
        res: TargetResult = await result(handle)

    assert res.status == "validated" and res.validation and res.validation.ok
    assert len(s.names("submit_job")) == 1 and len(s.names("validate_image")) == 2
    # The recheck answered the wait, not the slow timer. (Not measured as elapsed test-server time: after
    # the workflow completes, the time-skipping server may jump its clock far ahead; observed 10 years.)
    assert not await _timer_fired(handle)
    assert await _search_attribute(handle, sa.FAILURE_CLASS) is None  # cleared once validated
    assert await _search_attribute(handle, sa.STAGE) == "done"
    assert res.failures == []


async def test_private_package_is_rechecked_on_the_slow_timer_without_a_signal(time_skipping_env):
    wid, tq = _ids()
    s = Standins(validations={KEY: ["blocked", "blocked", "pass"]})
    async with worker(time_skipping_env.client, tq, s):
        handle = await _start(time_skipping_env, s, tq, wid)
        before = await time_skipping_env.get_current_time()
        res: TargetResult = await result(handle)
        after = await time_skipping_env.get_current_time()

    assert res.status == "validated"
    assert len(s.names("submit_job")) == 1 and len(s.names("validate_image")) == 3
    assert (after - before).total_seconds() >= 2 * PolicySettings().visibility_recheck_interval_s
    assert await _timer_fired(handle)


async def test_failed_validation_fails_the_target_naming_the_check(time_skipping_env):
    wid, tq = _ids()
    s = Standins(validations={KEY: ["fail"]})
    async with worker(time_skipping_env.client, tq, s):
        handle = await _start(time_skipping_env, s, tq, wid)
        cause, res = await _failure(handle)
        status = await _status(handle)
    assert "validation failed: platform expected linux/amd64, observed linux/s390x" in cause.message
    assert status.stage == Stage.FAILED and len(s.names("validate_image")) == 1
    assert await _search_attribute(handle, sa.FAILURE_CLASS) == "validation"
    assert await _search_attribute(handle, sa.STAGE) == "failed"


async def test_status_query_names_the_validation_failure_class(time_skipping_env):
    wid, tq = _ids()
    s = Standins(validations={KEY: ["fail"]})
    async with worker(time_skipping_env.client, tq, s):
        handle = await _start(time_skipping_env, s, tq, wid)
        await _failure(handle)
        status = await _status(handle)
    assert status.failure_class == await _search_attribute(handle, sa.FAILURE_CLASS) == "validation"


async def test_recheck_signal_sent_during_validation_is_not_lost(time_skipping_env):
    wid, tq = _ids()
    s = Standins(validations={KEY: ["blocked", "pass"]})
    s.hold["validate_image"] = gate = asyncio.Event()
    async with worker(time_skipping_env.client, tq, s):
        handle = await _start(time_skipping_env, s, tq, wid)
        await eventually(lambda: _entered(s, "validate_image"), what="first validation running")
        # The operator flips the package public and signals while the first validation is in flight.
        await handle.signal(TargetBuildWorkflow.recheck)
        gate.set()
        res: TargetResult = await result(handle)  # time skipping would hide the wait: check the timer
    assert res.status == "validated" and len(s.names("validate_image")) == 2
    assert not await _timer_fired(handle)


async def _entered(s: Standins, name: str) -> bool:
    ev = s.entered.get(name)
    return bool(ev and ev.is_set())


async def _search_attribute(handle, key):
    return (await handle.describe()).typed_search_attributes.get(key)


async def _timer_fired(handle) -> bool:
    history = await handle.fetch_history()
    return any(e.HasField("timer_fired_event_attributes") for e in history.events)


async def test_preemption_retries_stop_when_the_class_budget_is_spent(time_skipping_env):
    wid, tq = _ids()
    budget = PolicySettings().retry_budget["preemption"]
    s = Standins(rounds={KEY: [Round(state="worker_failed", evidence=PREEMPTED)]})  # every round is preempted
    async with worker(time_skipping_env.client, tq, s):
        cause, res = await _failure(await _start(time_skipping_env, s, tq, wid))

    assert [i.round for i in s.names("submit_job")] == list(range(budget + 1))
    assert [f.decision for f in res.failures] == ["retry"] * budget + ["fail"]
    assert len(set(res.job_ids)) == budget + 1  # every resubmission has its own job name
    assert "preemption failure" in cause.message and res.status == "failed"


async def test_a_lost_log_the_image_cannot_prove_ends_log_lost_at_once_with_the_next_step(time_skipping_env):
    """Issue #26: a succeeded job whose log lost its markers, with no image to stand in, fails as
    ``log_lost`` after one check (no read-again loop, no resubmission), naming why and what to do."""
    wid, tq = _ids()
    marker = "uv sync layer 0 (small pkgs + torch) done"
    why = "the image cannot stand in for the lost log: no image at the tag"
    s = Standins(rounds={KEY: [Round(state="succeeded", missing=[marker], lost=[why])]})
    async with worker(time_skipping_env.client, tq, s):
        handle = await _start(time_skipping_env, s, tq, wid)
        cause, res = await _failure(handle)
        status = await _status(handle)

    assert [c.log_lost for c in s.names("capture_failure")] == [[why]]
    assert len(s.names("check_build_log")) == 1 and len(s.names("submit_job")) == 1
    assert s.names("validate_image") == []
    (f,) = res.failures
    assert (f.failure_class, f.decision, f.reasons) == ("log_lost", "fail", [why])
    assert "log_lost" in cause.message and why in cause.message
    assert "next step: The job succeeded but the log store lost lines" in cause.message
    assert "starter.py resume" in cause.message
    assert status.stage == Stage.FAILED and status.failure_class == "log_lost"
    assert s.names("check_build_log")[0].build_commit == target_input(wid).build_commit


async def test_markers_of_cached_steps_end_cache_unproven_with_the_cache_bypass_as_next_step(time_skipping_env):
    """A succeeded job whose unproven markers all come from steps kaniko took from its cache (a rebuild after a
    cancel): the target fails at once as ``cache_unproven`` (not a generic ``log_lost``), naming the cached step,
    and its next step bypasses the cache (a plain resume would take the same steps from it again)."""
    wid, tq = _ids()
    marker = "Megatron native imports OK"
    why = (f"kaniko took the steps of 1 marker(s) from its cache, so this build never printed them, and neither that "
           f"cache hit nor the image r/x:t@sha256:ab proves them: `{marker}` (unproven (kaniko took its step from "
           f"the cache: docker/Dockerfile.gpu-rl:68, `RUN if …`): it is printed on a branch of its step)")
    s = Standins(rounds={KEY: [Round(state="succeeded", missing=[marker], lost=[why], lost_cause="cache")]})
    async with worker(time_skipping_env.client, tq, s):
        handle = await _start(time_skipping_env, s, tq, wid)
        cause, res = await _failure(handle)
        status = await _status(handle)

    assert [(c.log_lost, c.log_lost_cause) for c in s.names("capture_failure")] == [([why], "cache")]
    assert len(s.names("check_build_log")) == 1 and len(s.names("submit_job")) == 1
    (f,) = res.failures
    assert (f.failure_class, f.decision, f.reasons) == ("cache_unproven", "fail", [why])
    assert "cache_unproven failure" in cause.message and "docker/Dockerfile.gpu-rl:68" in cause.message
    assert "KANIKO_CACHE=0" in cause.message and "starter.py resume" in cause.message
    assert status.stage == Stage.FAILED and status.failure_class == "cache_unproven"


async def test_the_digest_the_image_judgement_relied_on_is_the_one_validated(time_skipping_env):
    """Issue #34 item 3: without a `Pushed` line, the image judged for the lost log must still be at the tag."""
    wid, tq = _ids()
    judged = "sha256:" + "cd" * 32
    stood = {"uv sync layer 0 (small pkgs + torch) done": "image config history: its RUN step"}
    s = Standins(rounds={KEY: [Round(state="succeeded", stood_in=stood, image_digest=judged)]},
                 validations={KEY: ["pass"]})
    async with worker(time_skipping_env.client, tq, s):
        await result(await _start(time_skipping_env, s, tq, wid))
    assert [v.claimed_digest for v in s.names("validate_image")] == [judged]


async def test_a_log_line_against_the_plan_is_an_assertion_failure_never_validated(time_skipping_env):
    """Issue #34: the build's own output shows a marker with another value (every marker else present, the
    push seen): the target fails as assertion_failure naming the line, is not retried and never validated."""
    wid, tq = _ids()
    line = ("log line 41: `uv sync FINAL (...) done (megatron=0)` shows it with another value: the plan expects "
            "`uv sync FINAL (...) done (megatron=1)` (docker/Dockerfile.gpu-rl:56, planned INSTALL_MEGATRON=1)")
    s = Standins(rounds={KEY: [Round(state="succeeded", contradicted=[line])]}, validations={KEY: ["pass"]})
    async with worker(time_skipping_env.client, tq, s):
        cause, res = await _failure(await _start(time_skipping_env, s, tq, wid))

    assert [c.contradicted for c in s.names("capture_failure")] == [[line]]
    assert len(s.names("submit_job")) == 1 and s.names("validate_image") == []
    (f,) = res.failures
    assert (f.failure_class, f.decision, f.reasons) == ("assertion_failure", "fail", [line])
    assert "assertion_failure" in cause.message and "planned INSTALL_MEGATRON=1" in cause.message


async def test_an_image_that_stood_in_for_the_log_validates_and_says_so(time_skipping_env):
    wid, tq = _ids()
    stood = {"uv sync layer 0 (small pkgs + torch) done": "image config history: the docker/Dockerfile step"}
    s = Standins(rounds={KEY: [Round(state="succeeded", stood_in=stood)]}, validations={KEY: ["pass"]})
    async with worker(time_skipping_env.client, tq, s):
        res = await result(await _start(time_skipping_env, s, tq, wid))

    assert res.status == "validated" and res.log_check is not None and res.log_check.stood_in == stood
    assert "was incomplete (the log store holds no line of the job)" in res.message
    assert "the image stood in for 1 marker(s): uv sync layer 0" in res.message
