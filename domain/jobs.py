"""Rules about one target's Iris jobs: what a submission is called, and what a vanished job means (pure).

Why here: the target workflow, the submit activity and the tests must agree on them exactly, and a
rule that decides which job a build attaches to (or whether a forgotten job counts as built) is
domain policy, not plumbing. Workflows ask these functions; they never recompute the rules.
"""

from __future__ import annotations

import hashlib

from domain.failures import Classification, FailureClass
from domain.validation import ValidationReport

MAX_JOB_NAME = 63  # Iris job names are DNS-label sized


def generation_of(run_id: str) -> str:
    """A short, stable tag for one request generation, from the run id of the target's first execution.

    A new pipeline run (after a cancel or a failure) starts new target runs, so it gets a new
    generation and fresh job names; a retried activity, a worker crash or a continue-as-new keeps the
    first execution's run id, so the same submission keeps its name and attaches.

    Hashed, not a prefix: Temporal run ids are UUIDv7, whose leading digits are a timestamp shared by
    every run started within the same minute."""
    return hashlib.sha256(run_id.encode()).hexdigest()[:8]


def submission_name(planned: str, *, generation: str, round_: int) -> str:
    """The Iris job name of submission ``round_`` of a target in request generation ``generation``.

    ``planned`` is the name from the build contract (``job.job_name``); the suffixes keep every
    submission distinct (``-r<round>`` for a policy resubmit, ``-<generation>`` for a new request
    generation) while staying within ``MAX_JOB_NAME``. An empty generation keeps the names of runs
    recorded before generations existed."""
    suffix = (f"-{generation}" if generation else "") + (f"-r{round_}" if round_ else "")
    if not suffix:
        return planned[:MAX_JOB_NAME]
    return planned[: MAX_JOB_NAME - len(suffix)].rstrip("-") + suffix


def vanished_job_classification(job_id: str) -> Classification:
    """A job the controller forgot, with no image of ours in the registry: resubmit as worker loss."""
    return Classification(
        failure_class=FailureClass.WORKER_LOSS, retryable_by_default=True,
        reasons=[f"{job_id} vanished from the controller and the registry has no image from it"],
        operator_hint="Resubmitted under a new name (the kaniko cache makes it cheap).")


def registry_has_our_image(report: ValidationReport) -> bool:
    """The registry proves a vanished job built our image: a digest under our tag, and at least one
    OCI label check (revision, Harbor commit) that passed with none failing. Absence never counts."""
    labels = [c for c in report.checks if c.name.startswith("label:")]
    return bool(report.digest) and bool(labels) and all(c.verdict == "pass" for c in labels)
