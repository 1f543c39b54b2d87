"""Transient vs final in validation: an inconclusive report (the registry gave no verdict) is validated
again with backoff, as a visible waiting state with its cause, for a bounded configurable time; only a
``fail`` verdict fails the target, and a failure names the failing or inconclusive checks.

Scripted outcomes on the time-skipping server, and one real case: the REAL validate_image activity
against the real token registry while its fault proxy answers 503 for 30 s (real Temporal dev server,
real time), the rest of the target scripted.
"""

from __future__ import annotations

import asyncio
import uuid
from datetime import timedelta

import pytest
from temporalio.client import WorkflowFailureError
from temporalio.worker import Worker

from activities.build import BuildActivities
from domain.buildset import LayerCeiling
from domain.config import PolicySettings, ServiceConfig
from domain.models import Stage, TargetInput, TargetResult
from tests.fixtures_git import fresh_remotes
from tests.registry.imagepush import ImageSpec, Pusher, good_labels
from tests.workflows.standins import Standins, eventually, plan, result, target_input, worker
from workflows.target import TargetBuildWorkflow

KEY = "amd64-standard"
FAST = PolicySettings(validation_retry_initial_s=5, validation_retry_max_s=10)


def _ids() -> tuple[str, str]:
    u = uuid.uuid4().hex[:8]
    return f"wf-settle-{u}", f"tq-{u}"


async def _registry_wait(handle):
    st = await handle.query(TargetBuildWorkflow.status)
    return st if st.stage == Stage.WAITING and st.waiting and st.waiting.kind == "registry_inconclusive" else None


async def test_inconclusive_validation_waits_visibly_then_validates(time_skipping_env):
    env = time_skipping_env
    wid, tq = _ids()
    s = Standins(validations={KEY: ["inconclusive", "inconclusive", "pass"]}, policy=FAST)
    async with worker(env.client, tq, s):
        handle = await env.client.start_workflow(TargetBuildWorkflow.run, target_input(wid), id=wid, task_queue=tq)
        res: TargetResult = await result(handle)
        history = await handle.fetch_history()
    assert res.status == "validated" and res.validation.ok
    assert len(s.names("validate_image")) == 3 and len(s.names("submit_job")) == 1  # never rebuilt
    timers = [e.timer_started_event_attributes.start_to_fire_timeout.ToSeconds() for e in history.events
              if e.HasField("timer_started_event_attributes")]
    assert timers == [5, 10]  # backoff between the validations, capped by policy.validation_retry_max_s


async def test_waiting_state_names_the_inconclusive_check_and_the_budget_key(time_skipping_env):
    env = time_skipping_env
    wid, tq = _ids()
    s = Standins(validations={KEY: ["inconclusive", "pass"]},
                 policy=PolicySettings(validation_retry_initial_s=3600, validation_retry_max_s=3600,
                                       validation_inconclusive_budget_s=7200))
    async with worker(env.client, tq, s):
        handle = await env.client.start_workflow(TargetBuildWorkflow.run, target_input(wid), id=wid, task_queue=tq)
        st = await eventually(lambda: _registry_wait(handle), what="waiting on the registry")
        assert "digest" in st.waiting.detail and "RegistryUnavailable" in st.waiting.detail
        assert "config:policy.validation_inconclusive_budget_s" in st.waiting.detail
        assert st.waiting.command and "recheck" in st.waiting.command
        await handle.signal(TargetBuildWorkflow.recheck)  # the operator need not wait for the backoff
        res = await result(handle)
    assert res.status == "validated"


async def test_a_registry_silent_beyond_the_budget_waits_for_a_recheck_and_never_suggests_a_rebuild(
        time_skipping_env):
    env = time_skipping_env
    wid, tq = _ids()
    # 60 + 120 + 240 + 300 (capped) s of backoff fit in 900 s, another 300 s would not: five validations,
    # then the registry is taken for down (not the image) and the target waits for it, re-checkable.
    s = Standins(validations={KEY: ["inconclusive"] * 6 + ["pass"]},
                 policy=PolicySettings(validation_inconclusive_budget_s=900, validation_retry_initial_s=60,
                                       validation_retry_max_s=300, visibility_recheck_interval_s=86400))
    async with worker(env.client, tq, s):
        handle = await env.client.start_workflow(TargetBuildWorkflow.run, target_input(wid), id=wid, task_queue=tq)

        async def unreachable():
            st = await handle.query(TargetBuildWorkflow.status)
            return st if st.waiting and st.waiting.kind == "registry_unreachable" else None
        await env.sleep(timedelta(seconds=1000))  # past the 900 s budget (the backoff timers fire on the way)
        st = await eventually(unreachable, what="waiting for the registry past the budget")
        assert len(s.names("validate_image")) == 5 and st.stage == Stage.WAITING
        w = st.waiting
        assert w.detail.startswith("the registry did not answer for 15 min") and "build again" not in w.detail
        assert w.command == f"python starter.py recheck {wid} {KEY}" and f"`{w.command}`" in w.detail
        await handle.signal(TargetBuildWorkflow.recheck)  # still silent: waits again, nothing rebuilt
        await eventually(lambda: _validated_times(s, 6), what="the re-check")
        await handle.signal(TargetBuildWorkflow.recheck)  # the registry answers now
        res = await result(handle)
    assert res.status == "validated" and len(s.names("submit_job")) == 1


async def _validated_times(s, n: int) -> bool:
    return len(s.names("validate_image")) >= n


async def test_a_fail_verdict_fails_at_once_without_waiting(time_skipping_env):
    env = time_skipping_env
    wid, tq = _ids()
    s = Standins(validations={KEY: ["fail"]}, policy=FAST)
    async with worker(env.client, tq, s):
        handle = await env.client.start_workflow(TargetBuildWorkflow.run, target_input(wid), id=wid, task_queue=tq)
        with pytest.raises(WorkflowFailureError) as info:
            await result(handle)
    assert "platform expected linux/amd64, observed linux/s390x" in info.value.cause.message
    assert len(s.names("validate_image")) == 1


# ---------------------------------------------------------------- real registry, real 503s
async def test_a_30s_registry_503_during_validation_does_not_fail_the_target(
        temporal_client, token_registry, tmp_path, monkeypatch):
    remotes = fresh_remotes(tmp_path / "remotes")
    build, harbor = remotes.marinskyrl_head, "b" * 40
    repo = f"lab/settle-{uuid.uuid4().hex[:8]}"
    token_registry.set_public(repo, True)
    pusher = Pusher(token_registry.url, token_registry.credentials)
    try:
        pushed = await pusher.push_image(repo, "t1", ImageSpec(labels=good_labels(build, harbor), layers=3, seed=repo))
    finally:
        await pusher.aclose()
    # The stand-in build log claims the digest that was really pushed (validation compares the two).
    monkeypatch.setattr("tests.workflows.standins.DIGEST", pushed.digest)
    monkeypatch.setenv("GRB_PUSH_TOKEN", token_registry.credentials[1])
    config = ServiceConfig.model_validate({
        "work_dir": str(tmp_path / "work"),
        "repos": {"marinskyrl_url": remotes.marinskyrl_url, "harbor_url": remotes.harbor_url},
        "clusters": {},
        "registry": {"image_repository": f"{token_registry.host}/{repo}", "insecure_hosts": [token_registry.host],
                     "user": {"kind": "literal_public", "value": token_registry.credentials[0]},
                     "token": {"kind": "env", "name": "GRB_PUSH_TOKEN"}}})
    target = plan()[0].model_copy(update={
        "image_repository": f"{token_registry.host}/{repo}", "tag": "t1",
        "layer_ceiling": LayerCeiling(min_layers=3, max_layer_bytes=1_000_000, warn_layer_bytes=500_000)})
    wid, tq = _ids()
    s = Standins(policy=FAST)
    real = BuildActivities(config)
    activities = [a for a in s.all() if a.__name__ != "validate_image"] + [real.validate_image]
    token_registry.inject(503, 1_000_000)
    try:
        async with Worker(temporal_client, task_queue=tq, workflows=[TargetBuildWorkflow], activities=activities):
            handle = await temporal_client.start_workflow(
                TargetBuildWorkflow.run,
                TargetInput(request_id=wid, target=target, build_commit=build, harbor_commit=harbor,
                            branch=f"gpu-rl-build/{wid}"),
                id=wid, task_queue=tq)
            st = await eventually(lambda: _registry_wait(handle), what="waiting on the registry", attempts=1200)
            assert st.failure_class == "validation_inconclusive" and "digest" in st.waiting.detail
            await asyncio.sleep(30)  # the outage lasts 30 s, then the registry answers again
            token_registry.inject(503, 0)
            res: TargetResult = await result(handle, timeout=120)
    finally:
        token_registry.inject(503, 0)
    assert res.status == "validated" and res.validation.ok, res.message
    assert token_registry.faults_served > 0
    assert len(s.names("submit_job")) == 1  # a registry outage never rebuilds
