"""Failure capture folds Iris attempts, kubectl pod facts and the log into the classifier's evidence.

Uses the real kubectl evidence client against the recorded-JSON kubectl stand-in (tests/standins), and
Iris models shaped like what a CoreWeave controller reports (preempted: "Pod not found"; OOM: 137)."""

from __future__ import annotations

from pathlib import Path

from activities.build import _evidence
from clients.iris import AttemptInfo, JobInfo, JobState, TaskInfo, TaskState
from clients.kube import KubeEvidence
from domain.failures import FailureClass, classify

STANDIN = str(Path(__file__).resolve().parents[1] / "standins" / "kubectl_standin")


def _job(state: JobState, error: str, attempt: AttemptInfo) -> tuple[JobInfo, list[AttemptInfo]]:
    task = TaskInfo(task_id="/tester/build/0", state=TaskState.FAILED, attempts=[attempt])
    return JobInfo(job_id="/tester/build", state=state, error=error, tasks=[task]), [attempt]


async def test_preempted_pod_classifies_as_preemption_from_kueue_events():
    facts = await KubeEvidence(STANDIN).collect("iris-tester-preempted-0-5e6f7a8b-0")
    info, attempts = _job(JobState.WORKER_FAILED, "Pod not found",
                          AttemptInfo(attempt_id=0, state=TaskState.WORKER_FAILED, error="Pod not found",
                                      is_worker_failure=True))
    c = classify(_evidence(info, attempts, [facts], "[k stdout] uv sync layer 0 (small pkgs + torch) done\n", []))
    assert c.failure_class is FailureClass.PREEMPTION and c.retryable_by_default
    assert any("EvictedDueToPreempted" in r or "WorkloadEvictedDueToPreempted" in r for r in c.reasons)


async def test_oom_killed_pod_classifies_as_oom_not_retryable():
    facts = await KubeEvidence(STANDIN).collect("iris-tester-oom-0-9c0d1e2f-0")
    info, attempts = _job(JobState.FAILED, "OOMKilled",
                          AttemptInfo(attempt_id=0, state=TaskState.FAILED, exit_code=137, error="OOMKilled"))
    c = classify(_evidence(info, attempts, [facts], "", []))
    assert c.failure_class is FailureClass.OOM and not c.retryable_by_default


async def test_missing_markers_without_other_evidence_is_an_assertion_failure():
    info, attempts = _job(JobState.SUCCEEDED, "", AttemptInfo(attempt_id=0, state=TaskState.SUCCEEDED, exit_code=0))
    c = classify(_evidence(info, attempts, [], "[k stdout] Pushing image to r:t\n", ["memray OK"]))
    assert c.failure_class is FailureClass.ASSERTION_FAILURE and "memray OK" in " ".join(c.reasons)
