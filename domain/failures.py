"""Failure classification for Iris build jobs, and the retry decision that follows from it (pure).

Why classify before retrying: a preempted kaniko build resumes cheaply from cache and should be
retried; a MANIFEST mismatch or a missing variable fails the same way every time and must not burn
hours of cluster time. Signatures come from the ops history (domain brief §7) and from how Iris
(0.2.20 and 0.2.227) reports outcomes: per-task timeout → FAILED "Execution timeout exceeded"; scheduling timeout
→ UNSCHEDULABLE; pod Evicted/Preempting/DeadlineExceeded → WORKER_FAILED; OOMKilled → FAILED 137.

Order matters: the most specific, non-retryable evidence (input errors in the log) wins over
generic infrastructure signals, and "the controller could not be reached" is never terminal.
"""

from __future__ import annotations

import re
from enum import StrEnum
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field


class FailureClass(StrEnum):
    PREEMPTION = "preemption"
    WORKER_LOSS = "worker_loss"
    OOM = "oom"
    REGISTRY_TRANSIENT = "registry_transient"
    INPUT_ERROR = "input_error"
    ASSERTION_FAILURE = "assertion_failure"
    TIMEOUT = "timeout"
    UNSCHEDULABLE = "unschedulable"
    CONTROLLER_BLIP = "controller_blip"  # not terminal: keep polling
    LOG_LOST = "log_lost"  # the job succeeded; its log lost lines the image could not stand in for
    # The job succeeded; kaniko took marker steps from its layer cache, so this build never printed their lines,
    # and neither the cache hit nor the image proves them (domain/markers.py cache_proves_line).
    CACHE_UNPROVEN = "cache_unproven"
    UNKNOWN = "unknown"


class _Model(BaseModel):
    model_config = ConfigDict(frozen=True)


class AttemptEvidence(_Model):
    state: str  # task state short name: failed, worker_failed, preempted, ...
    exit_code: int | None = None
    error: str = ""
    is_worker_failure: bool = False


class Evidence(_Model):
    """Everything known about a failed (or unreachable) job, from Iris, kubectl and the log."""

    job_state: str | None = None  # short name (failed, worker_failed, unschedulable, ...); None: unknown
    error: str = ""  # JobStatus.error
    attempts: list[AttemptEvidence] = Field(default_factory=list)
    pod_termination_reason: str | None = None
    pod_exit_code: int | None = None
    pod_condition_reasons: list[str] = Field(default_factory=list)
    pod_waiting_reason: str | None = None
    k8s_event_reasons: list[str] = Field(default_factory=list)
    log_tail: list[str] = Field(default_factory=list)
    missing_markers: list[str] = Field(default_factory=list)  # success markers absent from the log
    # The job succeeded, its log lost lines and the image could not stand in (domain/log_evidence.py): why.
    log_lost: list[str] = Field(default_factory=list)
    log_lost_cause: Literal["log", "cache"] = "log"  # "cache": every unproven marker's step was a cache hit
    # The job succeeded and its own output contradicts the plan (check_build_log): the line and the expectation.
    contradicted: list[str] = Field(default_factory=list)
    controller_unreachable: bool = False  # the last poll failed with Unavailable/transport


class Classification(_Model):
    failure_class: FailureClass
    reasons: list[str]  # the evidence that decided
    retryable_by_default: bool
    operator_hint: str


RETRYABLE = {FailureClass.PREEMPTION, FailureClass.WORKER_LOSS, FailureClass.REGISTRY_TRANSIENT,
             FailureClass.CONTROLLER_BLIP}
NEVER_RETRY = {FailureClass.INPUT_ERROR, FailureClass.ASSERTION_FAILURE}

# The one next step a lost log offers, on the target and on the build (domain/outcome.py targets_failure): the
# target's message names the workflow id in place of the placeholder.
RESUME_HINT = "python starter.py resume <workflow-id>"

HINTS = {
    FailureClass.PREEMPTION: "Preempted by Kueue/priority; retry (kaniko resumes from cache) and keep the cache.",
    FailureClass.WORKER_LOSS: "The worker or pod went away; retry under the preemption budget.",
    FailureClass.OOM: "Out of memory (exit 137); retry only with more RAM (e.g. 512/640 GB).",
    FailureClass.REGISTRY_TRANSIENT: "Registry I/O error (EOF/reset) on cache or push; resubmit.",
    FailureClass.INPUT_ERROR: "Bad template or inputs; fix the variable, pin, wheel URI/SHA, MANIFEST or arch.",
    FailureClass.ASSERTION_FAILURE: "A build step or assertion failed; fix pins/extras, do not retry blindly.",
    FailureClass.TIMEOUT: "The per-task timeout expired; check progress, raise --timeout if it was still going.",
    FailureClass.UNSCHEDULABLE: "No capacity matched the request; check resources, queue backlog and arch.",
    FailureClass.CONTROLLER_BLIP: "Controller unreachable; re-poll, the job state is unchanged.",
    FailureClass.LOG_LOST: ("The job succeeded but the log store lost lines and the pushed image could not prove "
                            "the missing markers (reasons above). Check the image named there; to build again run "
                            f"`{RESUME_HINT}` (kaniko reuses its cache). If it recurs, tell the "
                            "cluster operators: an Iris worker's log client keeps at most 10,000 unsent lines and "
                            "drops the oldest beyond that."),
    FailureClass.CACHE_UNPROVEN: (
        "The job succeeded and pushed our image, but kaniko took the marker steps named above from its layer cache "
        "(`Using caching version of cmd`): an earlier build printed their lines, not this one, and a cache hit "
        "proves only a fixed line its step always prints (not a branch, a computed value, or a line the step can "
        "skip). A resume that reuses the cache proves nothing more. To prove them by running, rebuild with "
        "kaniko's cache off: the build script reads KANIKO_CACHE=0 (MarinSkyRL docker/build_gpu_rl_kaniko.sh); set "
        "it in `clusters.<name>.job_env` of the worker's configuration for the target's cluster, restart the "
        f"worker, run `{RESUME_HINT}`, then remove it (the service has no per-target switch)."),
    FailureClass.UNKNOWN: "Unrecognised failure; an operator must look at the logs and events.",
}

# (class, compiled pattern, label). Searched in the job/attempt errors and the log tail, in order.
_LOG_SIGNATURES: list[tuple[FailureClass, re.Pattern[str], str]] = [
    (FailureClass.INPUT_ERROR, re.compile(r"parameter null or not set|: parameter not set"), "missing variable"),
    (FailureClass.INPUT_ERROR, re.compile(r"Refusing to build|declares no default"), "pin override"),
    (FailureClass.INPUT_ERROR, re.compile(r"wheel artifact SHA-256 mismatch"), "wheel SHA mismatch"),
    (FailureClass.INPUT_ERROR, re.compile(r"MANIFEST differ|expected-wheel-manifest.*differ"), "MANIFEST mismatch"),
    (FailureClass.INPUT_ERROR, re.compile(r"needs an? (aarch64|x86_64) builder, got"), "wrong arch"),
    (FailureClass.INPUT_ERROR, re.compile(r"uv: command not found|\[iris setup\] step"), "uv setup (no --no-sync)"),
    (FailureClass.INPUT_ERROR, re.compile(r"access key ID you provided does not exist"), "AWS creds forwarded"),
    (FailureClass.INPUT_ERROR, re.compile(r"must run inside a disposable Iris task|unsupported (uname|WHEEL_SOURCE)"),
     "script guard"),
    (FailureClass.REGISTRY_TRANSIENT,
     re.compile(r"(unexpected EOF|connection reset by peer|i/o timeout|TLS handshake timeout|"
                r"50[234] (Bad Gateway|Service Unavailable|Gateway Time-?out)|error (pushing|uploading) layer|"
                r"failed to (push|write) (to|layer|image)|Pushing layer .* EOF|toomanyrequests)", re.I),
     "registry I/O"),
    (FailureClass.ASSERTION_FAILURE, re.compile(r"validate-gpu-rl-pip-check|The package `"), "pip-check gate"),
    (FailureClass.ASSERTION_FAILURE, re.compile(r"error building image|RUN .* returned a non-zero code|"
                                                r"AssertionError|assertion failed", re.I), "build step failed"),
]
_PREEMPT_REASONS = {"EvictedDueToPreempted", "WorkloadEvictedDueToPreempted", "Preempted", "Preempting"}
_WORKER_LOSS_REASONS = {"Evicted", "DeadlineExceeded", "PodDeleted", "NodeLost", "Terminated"}


def classify(evidence: Evidence) -> Classification:
    """Decide the failure class from the evidence; ``reasons`` lists what decided."""
    ev = evidence
    texts = [ev.error, *(a.error for a in ev.attempts), *ev.log_tail]
    k8s = set(ev.pod_condition_reasons) | set(ev.k8s_event_reasons) | {
        r for r in (ev.pod_termination_reason, ev.pod_waiting_reason) if r}
    last = ev.attempts[-1] if ev.attempts else None

    def out(cls: FailureClass, *reasons: str) -> Classification:
        return Classification(failure_class=cls, reasons=list(reasons), retryable_by_default=cls in RETRYABLE,
                              operator_hint=HINTS[cls])

    if ev.controller_unreachable and (ev.job_state is None or ev.job_state not in _TERMINAL_JOB):
        return out(FailureClass.CONTROLLER_BLIP, "controller unreachable; last known state "
                   f"{ev.job_state or 'unknown'}")
    # 0. A succeeded job whose log lost lines the image could not prove (only check_build_log says so): not
    # an assertion (a failed step fails the job), and nothing in a log known to be incomplete outweighs it.
    if ev.contradicted:  # the build's own line against the plan: a shown line is proven, the image is wrong
        return out(FailureClass.ASSERTION_FAILURE, *ev.contradicted)
    if ev.log_lost:
        return out(FailureClass.CACHE_UNPROVEN if ev.log_lost_cause == "cache" else FailureClass.LOG_LOST,
                   *ev.log_lost)
    # 1. Deterministic input errors first: a retry would fail identically.
    for cls, pattern, label in _LOG_SIGNATURES:
        if cls is not FailureClass.INPUT_ERROR:
            continue
        if hit := _first_match(pattern, texts):
            return out(cls, f"{label}: {hit}")
    # 2. Preemption (Kueue/priority), then other worker loss.
    if preempt := sorted(k8s & _PREEMPT_REASONS):
        return out(FailureClass.PREEMPTION, *(f"k8s: {r}" for r in preempt))
    if last and last.state == "preempted":
        return out(FailureClass.PREEMPTION, "task attempt PREEMPTED")
    # 3. OOM: reaped with exit 137 (often without a final log line).
    if ev.pod_termination_reason == "OOMKilled" or any("OOMKilled" in t for t in texts):
        return out(FailureClass.OOM, "pod terminated: OOMKilled", *_exit(ev.pod_exit_code))
    if last and last.state == "failed" and last.exit_code == 137 and not ev.log_tail:
        return out(FailureClass.OOM, "exit 137 with no log output")
    # 4. Timeouts.
    if any("Execution timeout exceeded" in t for t in texts):
        return out(FailureClass.TIMEOUT, "Iris: Execution timeout exceeded")
    if ev.job_state == "unschedulable" or "FailedScheduling" in k8s or "Unschedulable" in k8s:
        detail = next((t for t in texts if "Scheduling timeout" in t or "unschedulable" in t.lower()), "")
        return out(FailureClass.UNSCHEDULABLE, f"job state {ev.job_state}",
                   *(f"k8s: {r}" for r in sorted(k8s & {"FailedScheduling", "Unschedulable"})),
                   *([detail] if detail else []))
    if worker := sorted(k8s & _WORKER_LOSS_REASONS):
        return out(FailureClass.WORKER_LOSS, *(f"k8s: {r}" for r in worker))
    if ev.job_state == "worker_failed" or (last and (last.is_worker_failure or last.state == "worker_failed")):
        return out(FailureClass.WORKER_LOSS, f"job state {ev.job_state}",
                   *([f"attempt: {last.error}"] if last and last.error else []))
    if any(t.strip() == "Pod not found" for t in texts):
        return out(FailureClass.WORKER_LOSS, "Iris: Pod not found")
    # 5. Registry transients, then assertions and missing markers.
    for cls, pattern, label in _LOG_SIGNATURES:
        if cls is FailureClass.INPUT_ERROR:
            continue
        if hit := _first_match(pattern, texts):
            return out(cls, f"{label}: {hit}")
    if ev.missing_markers:
        return out(FailureClass.ASSERTION_FAILURE, *(f"missing marker: {m}" for m in ev.missing_markers))
    # Iris's own reason, in one line with the state (e.g. "job state killed: Terminated by user"): it is
    # what follow, the report and the UI show for a failure nothing above recognised.
    return out(FailureClass.UNKNOWN, f"job state {ev.job_state}" + (f": {ev.error}" if ev.error else ""))


_TERMINAL_JOB = {"succeeded", "failed", "killed", "worker_failed", "unschedulable"}


def _first_match(pattern: re.Pattern[str], texts: list[str]) -> str | None:
    for text in texts:
        for line in text.splitlines() or [text]:
            if pattern.search(line):
                return line.strip()[:300]
    return None


def _exit(code: int | None) -> list[str]:
    return [f"exit code {code}"] if code is not None else []


RetryDecision = Literal["retry", "fail", "ask_operator"]


def decide_retry(classification: Classification, attempts_so_far: dict[str, int],
                 budget: dict[str, int]) -> RetryDecision:
    """Retry a retryable class while its budget (``PolicySettings.retry_budget``) lasts.

    Input and assertion failures always fail; unknown asks an operator; a lost log fails unless a
    budget names it; a controller blip is not a
    failure (re-poll, i.e. "retry" the observation, no budget used); OOM and timeout and
    unschedulable need a changed request, so they go to an operator unless a budget names them."""
    cls = classification.failure_class
    if cls in NEVER_RETRY:
        return "fail"
    if cls is FailureClass.CONTROLLER_BLIP:
        return "retry"
    if cls is FailureClass.UNKNOWN:
        return "ask_operator"
    if cls is FailureClass.LOG_LOST and str(cls) not in budget:
        return "fail"  # a rebuild prints the same burst; the hint says what to check first
    if cls is FailureClass.CACHE_UNPROVEN:
        return "fail"  # a resubmission takes the same steps from the same cache; the hint says how to bypass it
    key = str(cls)
    if key not in budget:  # retryable without a budget means budget 0; the rest need a changed request
        return "fail" if classification.retryable_by_default else "ask_operator"
    return "retry" if attempts_so_far.get(key, 0) < budget[key] else "fail"
