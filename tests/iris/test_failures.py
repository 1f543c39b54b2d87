"""Failure classifier on recorded evidence (kubectl JSON + Iris errors + log lines) and retry policy."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from clients.kube import pod_facts
from domain.failures import AttemptEvidence, Classification, Evidence, FailureClass, classify, decide_retry

KUBE = Path(__file__).resolve().parents[1] / "data" / "kube"


def recorded(pod: str, **kw) -> Evidence:
    """Evidence built the way the service builds it: from recorded kubectl output."""
    p = json.loads((KUBE / "pods" / f"{pod}.json").read_text())
    events = json.loads((KUBE / "events" / f"{pod}.json").read_text())["items"]
    workloads = json.loads((KUBE / "events" / "_workloads.json").read_text())["items"]
    events += [e for e in workloads if e["involvedObject"]["name"].startswith(f"pod-{pod}")]
    f = pod_facts(pod, p, events)
    return Evidence(pod_termination_reason=f.termination_reason, pod_exit_code=f.exit_code,
                    pod_condition_reasons=f.condition_reasons, pod_waiting_reason=f.waiting_reason,
                    k8s_event_reasons=f.event_reasons, **kw)


def att(state, code=None, error="", worker=False):
    return AttemptEvidence(state=state, exit_code=code, error=error, is_worker_failure=worker)


CASES = {
    "preemption: kueue eviction": (
        recorded("iris-tester-preempted-0-5e6f7a8b-0", job_state="worker_failed", error="Pod not found",
                 attempts=[att("worker_failed", 0, "Pod not found", True)]),
        FailureClass.PREEMPTION, "EvictedDueToPreempted"),
    "preemption: priority band": (
        Evidence(job_state="running", attempts=[att("preempted", 0, "Preempted by higher priority job")]),
        FailureClass.PREEMPTION, "PREEMPTED"),
    "worker_loss: pod vanished": (
        Evidence(job_state="failed", error="Pod not found", attempts=[att("failed", 0, "Pod not found")]),
        FailureClass.WORKER_LOSS, "Pod not found"),
    "worker_loss: reconcile failure": (
        Evidence(job_state="worker_failed", attempts=[att("worker_failed", 0, "worker reconcile failure", True)]),
        FailureClass.WORKER_LOSS, "worker_failed"),
    "worker_loss: evicted pod": (
        Evidence(job_state="worker_failed", pod_termination_reason="Evicted"),
        FailureClass.WORKER_LOSS, "Evicted"),
    "oom: recorded pod": (
        recorded("iris-tester-oom-0-9c0d1e2f-0", job_state="failed", error="OOMKilled",
                 attempts=[att("failed", 137, "OOMKilled")]),
        FailureClass.OOM, "OOMKilled"),
    "oom: silent 137": (
        Evidence(job_state="failed", attempts=[att("failed", 137, "Exit code: 137")]),
        FailureClass.OOM, "137"),
    "registry: push EOF": (
        Evidence(job_state="failed", attempts=[att("failed", 1, "Exit code: 1")],
                 log_tail=["error pushing image: failed to push to destination ghcr.io/x:tag: "
                           "Patch https://ghcr.io/v2/x/blobs/uploads/abc: unexpected EOF"]),
        FailureClass.REGISTRY_TRANSIENT, "unexpected EOF"),
    "input: missing variable": (
        Evidence(job_state="failed", error="Exit code: 1. stderr: /tmp/build.sh: line 12: GHCR_TOKEN: "
                 "parameter null or not set"),
        FailureClass.INPUT_ERROR, "missing variable"),
    "input: pin override": (
        Evidence(job_state="failed", log_tail=["HARBOR_COMMIT=abc disagrees with docker/Dockerfile.gpu-rl "
                                               "(def). Refusing to build."]),
        FailureClass.INPUT_ERROR, "pin override"),
    "input: wheel sha": (
        Evidence(job_state="failed", log_tail=["wheel artifact SHA-256 mismatch: expected 1f.. got 2e.."]),
        FailureClass.INPUT_ERROR, "wheel SHA"),
    "input: MANIFEST": (
        Evidence(job_state="failed", log_tail=["/tmp/expected-wheel-manifest wheels/MANIFEST differ: char 18, line 1"]),
        FailureClass.INPUT_ERROR, "MANIFEST"),
    "input: wrong arch": (
        Evidence(job_state="failed", log_tail=["docker/Dockerfile.gpu-rl-arm64 needs an aarch64 builder, got x86_64"]),
        FailureClass.INPUT_ERROR, "wrong arch"),
    "input: uv setup": (
        Evidence(job_state="failed", log_tail=["[iris setup] step 1/2", "bash: line 1: uv: command not found"]),
        FailureClass.INPUT_ERROR, "uv setup"),
    "input: AWS creds": (
        Evidence(job_state="failed", log_tail=["botocore.exceptions.ClientError: An error occurred "
                                               "(InvalidAccessKeyId): The access key ID you provided does not "
                                               "exist in our records."]),
        FailureClass.INPUT_ERROR, "AWS"),
    "input beats preemption evidence": (
        recorded("iris-tester-preempted-0-5e6f7a8b-0", job_state="failed",
                 log_tail=["MANIFEST differ: char 18, line 1"]),
        FailureClass.INPUT_ERROR, "MANIFEST"),
    "assertion: RUN step": (
        Evidence(job_state="failed", log_tail=["error building image: error building stage: failed to execute "
                                               "command: waiting for process to exit: exit status 1"]),
        FailureClass.ASSERTION_FAILURE, "build step"),
    "assertion: pip-check": (
        Evidence(job_state="failed", log_tail=["validate-gpu-rl-pip-check: 5 conflicts, expected 3"]),
        FailureClass.ASSERTION_FAILURE, "pip-check"),
    "assertion: missing marker on a green job": (
        Evidence(job_state="succeeded", missing_markers=["Pushed <repo>@sha256:<digest>"]),
        FailureClass.ASSERTION_FAILURE, "missing marker"),
    "log_lost: a green job whose log and image cannot prove the markers": (
        Evidence(job_state="succeeded", missing_markers=["Pushed <repo>@sha256:<digest>"],
                 log_lost=["the log store kept no line of the job and the image cannot stand in for 31 markers"]),
        FailureClass.LOG_LOST, "log store kept no line"),
    "cache_unproven: a green job whose unproven markers' steps kaniko took from its cache": (
        Evidence(job_state="succeeded", missing_markers=["Megatron native imports OK"], log_lost_cause="cache",
                 log_lost=["kaniko took the steps of 1 marker(s) from its cache, so this build never printed them"]),
        FailureClass.CACHE_UNPROVEN, "from its cache"),
    "timeout: per-task": (
        Evidence(job_state="failed", error="Execution timeout exceeded",
                 attempts=[att("failed", 0, "Execution timeout exceeded")]),
        FailureClass.TIMEOUT, "Execution timeout"),
    "unschedulable: scheduling timeout": (
        Evidence(job_state="unschedulable", error="Scheduling timeout exceeded (Duration(3.000s))"),
        FailureClass.UNSCHEDULABLE, "unschedulable"),
    "unschedulable: recorded FailedScheduling": (
        recorded("iris-tester-sched-0-7e8f9a0b-0", job_state="pending"),
        FailureClass.UNSCHEDULABLE, "FailedScheduling"),
    "controller blip": (
        Evidence(job_state="running", controller_unreachable=True),
        FailureClass.CONTROLLER_BLIP, "unreachable"),
    "unknown": (
        Evidence(job_state="failed", error="Exit code: 3", attempts=[att("failed", 3, "Exit code: 3")],
                 log_tail=["something odd"]),
        FailureClass.UNKNOWN, "Exit code: 3"),
}


@pytest.mark.parametrize("case", list(CASES))
def test_classify(case):
    evidence, expected, reason_fragment = CASES[case]
    result = classify(evidence)
    assert result.failure_class is expected, result
    assert any(reason_fragment in r for r in result.reasons), result.reasons
    assert result.operator_hint


def test_every_class_is_covered_by_a_case():
    assert {c[1] for c in CASES.values()} == set(FailureClass)


def test_image_pull_backoff_is_not_a_preemption_or_input_error():
    result = classify(recorded("iris-tester-pull-0-3a4b5c6d-0", job_state="running", controller_unreachable=False))
    assert result.failure_class is FailureClass.UNKNOWN  # pods recover in kubelet backoff: don't relaunch


def test_retryable_defaults():
    assert classify(CASES["preemption: kueue eviction"][0]).retryable_by_default
    assert not classify(CASES["input: MANIFEST"][0]).retryable_by_default
    assert not classify(CASES["oom: recorded pod"][0]).retryable_by_default


def _cls(c: FailureClass) -> Classification:
    return Classification(failure_class=c, reasons=[], retryable_by_default=c in {
        FailureClass.PREEMPTION, FailureClass.WORKER_LOSS, FailureClass.REGISTRY_TRANSIENT,
        FailureClass.CONTROLLER_BLIP}, operator_hint="")


BUDGET = {"preemption": 3, "worker_loss": 2, "registry_transient": 2}


@pytest.mark.parametrize("cls,so_far,expected", [
    (FailureClass.PREEMPTION, {}, "retry"),
    (FailureClass.PREEMPTION, {"preemption": 2}, "retry"),
    (FailureClass.PREEMPTION, {"preemption": 3}, "fail"),
    (FailureClass.WORKER_LOSS, {"worker_loss": 2}, "fail"),
    (FailureClass.REGISTRY_TRANSIENT, {"preemption": 9}, "retry"),
    (FailureClass.INPUT_ERROR, {}, "fail"),
    (FailureClass.ASSERTION_FAILURE, {}, "fail"),
    (FailureClass.UNKNOWN, {}, "ask_operator"),
    (FailureClass.OOM, {}, "ask_operator"),
    (FailureClass.TIMEOUT, {}, "ask_operator"),
    (FailureClass.UNSCHEDULABLE, {}, "ask_operator"),
    (FailureClass.CONTROLLER_BLIP, {}, "retry"),
])
def test_decide_retry(cls, so_far, expected):
    assert decide_retry(_cls(cls), so_far, BUDGET) == expected


def test_never_retry_input_even_with_a_budget():
    assert decide_retry(_cls(FailureClass.INPUT_ERROR), {}, {"input_error": 5}) == "fail"
    assert decide_retry(_cls(FailureClass.ASSERTION_FAILURE), {}, {"assertion_failure": 5}) == "fail"
    assert decide_retry(_cls(FailureClass.OOM), {"oom": 0}, {"oom": 1}) == "retry"
    assert decide_retry(_cls(FailureClass.PREEMPTION), {}, {}) == "fail"  # no budget configured
