"""Models that cross the Temporal boundary: workflow/activity inputs, outputs, progress and reports.

Why here: workflows, activities, the starter and the tests share them, and they must stay importable
without Temporal. Everything is small: large logs and diagnostics live in files referenced by
``FileRef`` (path + digest), never in history. No model carries a secret.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Literal

from pydantic import AliasChoices, BaseModel, Field, field_validator

from domain.buildset import BuildRequest, TargetSpec
from domain.failures import Classification
from domain.validation import ValidationReport


def pipeline_id(source_commit: str, harbor_commit: str) -> str:
    """One pipeline per (source commit, Harbor commit): the dedup key shared by starter and schedules."""
    return f"gpu-rl-build-{source_commit[:12]}-{harbor_commit[:12]}"


def target_workflow_id(pipeline_workflow_id: str, target_key: str) -> str:
    """The child workflow id of one target: the one rule shared by the pipeline, the starter and tests."""
    return f"{pipeline_workflow_id}/{target_key}"


class Stage(StrEnum):
    QUEUED = "queued"
    LOADING = "loading"
    PREPARING_SOURCE = "preparing_source"
    PLANNING = "planning"
    PLANNED = "planned"
    SUBMITTING = "submitting"
    RUNNING = "running"
    CAPTURING = "capturing"
    WAITING = "waiting"  # for an operator: decision, visibility flip, merge authorization
    VALIDATING = "validating"
    RECORDING = "recording"
    AWAITING_MERGE = "awaiting_merge"
    MERGING = "merging"
    DONE = "done"
    FAILED = "failed"
    CANCELLED = "cancelled"


class WaitingReason(BaseModel):
    """What a build waits for and the exact operator command that unblocks it (None: nothing to run)."""

    kind: Literal["operator_decision", "package_visibility", "registry_inconclusive", "registry_unreachable",
                  "merge_checks", "merge_authorization", "step_retrying", "registry_drift", "head_moved",
                  "merge_conflict"]
    target: str | None = None  # target key, or None for the pipeline itself
    detail: str  # one short sentence: what is needed
    command: str | None = None  # e.g. ``python starter.py recheck <wid> amd64-standard``


class FailureInfo(BaseModel):
    """Why a workflow ended failed or cancelled: the error, where it comes from, and what to do next."""

    failure_class: str  # the BuildFailureClass value: input, cancelled, a target class, internal, ...
    error_type: str  # the error's class, e.g. InputError, BuildFailed, ActivityTimeout
    message: str
    location: str | None = None  # file:line when the error names one
    next_step: str


class FileRef(BaseModel):
    """A large artifact kept out of Temporal history: its evidence-store URI and digest.

    ``uri`` is an fsspec URL (``file:///…`` in the sandbox, ``s3://…`` in production) readable by the
    starter without the worker that wrote it. Histories written before the store read as ``path``."""

    uri: str = Field(validation_alias=AliasChoices("uri", "path"))
    sha256: str
    size_bytes: int


# ---------------------------------------------------------------- pipeline stage 1-3


class PipelineInput(BaseModel):
    request: BuildRequest
    request_id: str  # the workflow id; names the build branch and commit trailer
    plan_only: bool = False
    source_commit: str | None = None  # the default-branch head the starter saw (dedup key)
    harbor_commit: str | None = None
    # Set by the pipeline itself when it continues as new while waiting for the merge.
    resume: MergeWaitState | None = None
    # History events one run may grow to while waiting for the merge before it continues as new
    # (well under Temporal's 10,240-event warning; lowered only to record a short replay history).
    merge_wait_events_per_run: int = 2_000


class LoadStateInput(BaseModel):
    request_id: str
    source_commit: str | None = None
    harbor_ref: str | None = None


class BuildState(BaseModel):
    base_commit: str
    default_branch: str
    harbor_commit: str  # to bake
    harbor_pinned: dict[str, str]  # Dockerfile -> currently pinned HARBOR_COMMIT
    architectures: list[str]
    policies: list[str]
    disagreements: list[str]
    fallbacks: list[str] = Field(default_factory=list)  # planned values the prose did not give (config used)


# Upstream (Harbor) text is capped where it enters history: a 1.5 MB dependency value would exceed
# Temporal's payload limit and be retried for half an hour; it is cut with a note instead.
MAX_UPSTREAM_LINE = 400
MAX_UPSTREAM_LINES = 200


def cap_upstream_lines(lines: list[str], *, where: str) -> list[str]:
    """At most MAX_UPSTREAM_LINES lines of at most MAX_UPSTREAM_LINE characters, each cut one saying so.
    Idempotent (a capped list validates to itself, so a payload read back from history is unchanged)."""
    cut_note = " more characters cut; read "
    body, note = lines, None
    if lines and lines[-1].startswith("… ") and " more lines cut; read " in lines[-1]:
        body, note = lines[:-1], lines[-1]
    out = []
    for line in body[:MAX_UPSTREAM_LINES]:
        if len(line) > MAX_UPSTREAM_LINE and not (cut_note in line[MAX_UPSTREAM_LINE:]
                                                    and len(line) < MAX_UPSTREAM_LINE + 200):
            line = f"{line[:MAX_UPSTREAM_LINE]}… ({len(line) - MAX_UPSTREAM_LINE:,}{cut_note}{where})"
        out.append(line)
    if len(body) > MAX_UPSTREAM_LINES:
        note = f"… {len(body) - MAX_UPSTREAM_LINES:,} more lines cut; read {where}"
    return out + ([note] if note else [])


class HarborDiffSummary(BaseModel):
    old: str
    new: str
    affects_image: bool
    lines: list[str]

    @field_validator("lines")
    @classmethod
    def _capped(cls, lines: list[str]) -> list[str]:
        return cap_upstream_lines(lines, where="Harbor's pyproject.toml at the two commits")


class BundleSummary(BaseModel):
    sha256: str
    size_bytes: int
    file_count: int
    largest: list[tuple[str, int]] = Field(default_factory=list)
    suspicious: list[tuple[str, str]] = Field(default_factory=list)


class PrepareSourceInput(BaseModel):
    request_id: str
    base_commit: str
    harbor_commit: str
    push: bool = True
    plan_only: bool = False  # a --plan refused here removes its worktree and bundle (nothing left on disk)
    allow_suspicious_files: bool = False  # the request's --allow-suspicious-files (the bundle check)


class SourceSnapshot(BaseModel):
    build_commit: str
    base_commit: str
    branch: str
    pushed: bool
    created_commit: bool
    harbor_commit: str
    harbor_diff: HarborDiffSummary | None
    changed_files: list[str]
    ops_doc_corrected: bool
    bundle: BundleSummary
    # What the build commit corrected in the ops doc, one "file:line: before → after (why)" per line,
    # computed from the base commit (the same answer on any worker, also once the branch exists).
    ops_corrections: list[str] = Field(default_factory=list)
    # Where the validated digests go, decided at plan time: "pin_table" (the PR updates ``pin_table``) or
    # "pr_body" (no pin table in the repository: the PR body and the issue carry them, as the runbook
    # says). None: a snapshot from before this was decided (the record step looks for the table then).
    digests_in: Literal["pin_table", "pr_body"] | None = None
    pin_table: str | None = None
    pin_target_reason: str = ""


class PlanTargetsInput(BaseModel):
    request: BuildRequest
    build_commit: str
    harbor_commit: str
    # How to re-create the (not yet pushed) build commit on a worker that lacks the worktree.
    request_id: str = ""
    base_commit: str = ""
    # A --plan: its worktree and bundles are removed when planning ends (a plan leaves nothing on disk).
    plan_only: bool = False


class PreflightInput(BaseModel):
    """What the run will need, known once planning is done and before anything is pushed or submitted."""

    request_id: str
    base_commit: str
    build_commit: str
    changed_files: list[str] = Field(default_factory=list)  # build commit vs base (the script is read at base if unchanged)
    targets: list[TargetSpec]
    issue_url: str | None = None


class PreflightCheck(BaseModel):
    """One proven (or missing) prerequisite; ``config_key`` says where it is configured."""

    name: str
    config_key: str
    ok: bool
    detail: str
    transient: bool = False  # failed because a service did not answer (worth a bounded retry)
    fingerprint: str | None = None  # credentials only: sha256 prefix of the value, never the value


class PreflightReport(BaseModel):
    checks: list[PreflightCheck]

    @property
    def failed(self) -> list[PreflightCheck]:
        return [c for c in self.checks if not c.ok]

    def message(self) -> str:
        return "preflight failed, nothing was pushed, submitted or opened: " + "; ".join(
            f"{c.name} ({c.config_key}): {c.detail}" for c in self.failed)


# ---------------------------------------------------------------- per-target child workflow


class TargetInput(BaseModel):
    request_id: str
    target: TargetSpec
    build_commit: str
    harbor_commit: str
    branch: str
    # Set by the target itself when a long wait (operator decision, package visibility, registry) continues
    # as new; the next run picks the wait up where it was.
    resume: TargetResume | None = None
    # History events one run may grow to during such a wait before it continues as new (well under
    # Temporal's 10,240-event warning; lowered only to record a short replay history).
    wait_events_per_run: int = 2_000


class SubmitInput(BaseModel):
    request_id: str
    target: TargetSpec
    build_commit: str
    branch: str
    round: int  # 0 for the first submission; a policy resubmit gets a new, deterministic name
    generation: str = ""  # request generation (domain.jobs.generation_of): a new run gets fresh job names


class SubmittedJob(BaseModel):
    job_id: str
    cluster: str
    attached: bool  # True when an existing job with this name was found (retry/re-run)
    submitted_at_ms: int


class MonitorInput(BaseModel):
    job_id: str
    cluster: str
    return_after_s: float  # return a progress snapshot at least this often (UI/query freshness)
    log_cursor: int = 0
    last_marker: str | None = None
    markers: list[str] = Field(default_factory=list)  # marker texts whose latest sighting is progress


class JobProgress(BaseModel):
    job_id: str
    state: str  # short Iris job state: pending/running/succeeded/failed/...
    terminal: bool
    attempt: int = 0
    preemptions: int = 0
    failures: int = 0
    elapsed_s: float = 0.0
    pending_reason: str | None = None
    error: str | None = None
    last_marker: str | None = None
    log_cursor: int = 0
    controller_reachable: bool = True
    missing: bool = False  # the controller no longer knows the job (pruned): never success


class LogCheckInput(BaseModel):
    request_id: str
    job_id: str
    cluster: str
    target: TargetSpec
    # Where the log cannot prove a marker, the image at the tag can (domain/log_evidence.py): it must carry
    # these as its revision / Harbor labels. Absent (a run scheduled by older code): no image stands in.
    build_commit: str | None = None
    harbor_commit: str | None = None


class LogCheck(BaseModel):
    log: FileRef
    found: list[str]
    missing: list[str]
    cached: list[str] = Field(default_factory=list)  # proven by kaniko cache-hit lines
    final_push_seen: bool
    pushed_digest: str | None
    # The log was not complete evidence (empty, seq holes, markers absent from a succeeded job's log): why.
    incomplete: list[str] = Field(default_factory=list)
    stood_in: dict[str, str] = Field(default_factory=dict)  # marker -> the image evidence that proved it
    lost: list[str] = Field(default_factory=list)  # log_lost: why neither the log nor the image proves ``missing``
    unproven: dict[str, str] = Field(default_factory=dict)  # log_lost: marker -> why nothing proves it
    # Why log_lost: "cache" where every unproven marker's step was a kaniko cache hit (domain/log_evidence.py
    # LogJudgement.cause): the class is then cache_unproven, whose next step bypasses the cache.
    lost_cause: Literal["log", "cache"] = "log"
    # Lines of the build's own output against the plan (another value, an excluded branch): assertion_failure.
    contradicted: list[str] = Field(default_factory=list)
    # The registry digest the judgement relied on where the image stood in for the log (no `Pushed` line): the
    # validation must find the same digest at the tag (domain/validation.py check_claimed_digest).
    image_digest: str | None = None


class CaptureInput(BaseModel):
    request_id: str
    job_id: str
    cluster: str
    target_key: str
    missing_markers: list[str] = Field(default_factory=list)
    log_lost: list[str] = Field(default_factory=list)  # LogCheck.lost: classify as log_lost with these reasons
    log_lost_cause: Literal["log", "cache"] = "log"  # LogCheck.lost_cause: "cache" classifies as cache_unproven
    contradicted: list[str] = Field(default_factory=list)  # LogCheck.contradicted: an assertion_failure


class FailureRecord(BaseModel):
    job_id: str
    failure_class: str
    reasons: list[str]
    decision: Literal["retry", "fail", "ask_operator", "abort"]
    diagnostics: FileRef | None = None
    log: FileRef | None = None  # the job's full (redacted) log in the evidence store
    failing_line: str | None = None  # the (redacted) log line the failure is quoted by
    hint: str = ""


class CapturedFailure(BaseModel):
    classification: Classification
    diagnostics: FileRef
    log: FileRef | None = None
    failing_line: str | None = None


class ValidateInput(BaseModel):
    target: TargetSpec
    build_commit: str
    harbor_commit: str
    claimed_digest: str | None = None  # the pushed digest the build log states; must be the registry's


class TerminateInput(BaseModel):
    cluster: str
    job_ids: list[str]  # exact ids of jobs this workflow submitted


class OperatorDecision(BaseModel):
    action: Literal["retry", "abort"]
    by: str = "operator"
    note: str = ""
    verified: str = ""  # set by the worker: how ``by`` was found to be a configured operator
    temporal_identity: str | None = None


class TargetStatus(BaseModel):
    key: str
    stage: Stage
    job_ids: list[str] = Field(default_factory=list)
    progress: JobProgress | None = None
    failure_class: str | None = None
    waiting: WaitingReason | None = None
    validation_ok: bool | None = None
    updated_at: str | None = None
    message: str = ""  # the terminal outcome (failure with next step, or the validated image)


class TargetBrief(BaseModel):
    """What a target tells its pipeline on every stage change (for the pipeline's status and UI details)."""

    key: str
    stage: Stage
    job_id: str | None = None
    failure_class: str | None = None
    waiting: WaitingReason | None = None


class TargetResult(BaseModel):
    key: str
    architecture: str
    variant: str
    status: Literal["validated", "failed", "aborted"]
    cluster: str
    job_ids: list[str]
    tag: str
    image_ref: str
    digest: str | None = None
    platform: str | None = None
    validation: ValidationReport | None = None
    log_check: LogCheck | None = None
    failures: list[FailureRecord] = Field(default_factory=list)
    message: str = ""
    # Set when this result was adopted from an earlier run of the same build commit (no new Iris job):
    # the target workflow id and run id that built and validated it.
    adopted_from: str | None = None


class TargetResume(BaseModel):
    """What a target carries into the next run when a long wait continues as new: bounded, whatever the
    wait's length (the result so far, the status operators see, and the wait's own clock)."""

    phase: Literal["decision", "validation"]
    round: int = 0  # the submission round whose failure awaits the decision
    used: dict[str, int] = Field(default_factory=dict)  # retries used per failure class
    result: TargetResult
    status: TargetStatus
    evidence: dict[str, str] = Field(default_factory=dict)
    waiting_since: str | None = None  # ISO; operator-wait metric
    waiting_reason: str = "decision"
    decision_deadline: str | None = None  # ISO; the decision wait ends as "fail" then
    decision: OperatorDecision | None = None  # arrived as the run continued
    recheck: bool = False  # a re-check arrived as the run continued
    validation_started: str | None = None  # ISO; the registry's inconclusive budget counts from here
    sent: TargetBrief | None = None  # what the pipeline was last told (never told twice)
    sent_attributes: list[str | None] | None = None  # [stage, failure class] last upserted
    runs: int = 1


class AdoptInput(BaseModel):
    """Ask whether an earlier run of the same build commit already validated this target."""

    request_id: str
    target: TargetSpec
    build_commit: str
    harbor_commit: str


class AdoptResult(BaseModel):
    result: TargetResult | None = None  # the earlier validated result, re-checked; None: build it
    reason: str = ""  # why it was (not) adopted, for the log and the report


# ---------------------------------------------------------------- record and merge


class RecordInput(BaseModel):
    request_id: str
    request: BuildRequest
    source: SourceSnapshot
    targets: list[TargetResult]
    workflow_url: str | None = None


class PullRequestInfo(BaseModel):
    number: int
    url: str
    head_sha: str
    state: str = "open"
    merged: bool = False
    merge_commit: str | None = None
    merged_by: str | None = None  # the GitHub login that merged it (by hand on GitHub, or the service's)
    pin_commit: str | None = None
    issue_comment_url: str | None = None


class GitHubApproval(BaseModel):
    """A merge authorization given on GitHub by a configured operator, verified through the API."""

    login: str
    via: Literal["review", "comment"]
    url: str | None = None
    verified: str  # how the login was found to be an operator: "config:operators.logins" or "team org/slug"


class PinnedImage(BaseModel):
    """A validated image the PR pins: the merge wait checks the registry still serves it as validated."""

    key: str
    image_repository: str
    tag: str
    digest: str


class RegistryDrift(BaseModel):
    """Someone else changed a pinned image in the registry after validation (domain/outcome.registry_drift)."""

    key: str
    image: str  # repository:tag
    validated: str  # the digest the PR pins
    kind: Literal["moved", "gone", "private"]
    now: str | None = None  # the digest the tag points at now ("moved")
    detail: str = ""


class ForeignHead(BaseModel):
    """The PR's head is not the pin commit this build pushed: someone else moved the build branch. Who and
    when come from GitHub's repository activity (None: GitHub named no push of this head)."""

    sha: str  # the head GitHub shows now
    pin_commit: str  # the commit the service pushed (the only one it merges)
    branch: str
    pushed_by: str | None = None
    pushed_at: str | None = None
    how: str = ""  # push, force_push, ... as GitHub's activity names it; "" = not known
    restore_command: str = ""  # puts the pin commit back, only if the branch is still at ``sha``


class MergedPins(BaseModel):
    """What the pin table of a merge commit really holds, compared with the validated digests."""

    path: str
    commit: str
    holds_validated: bool
    differences: list[str] = Field(default_factory=list)  # "amd64-standard pins X, not the validated Y"
    unreadable: str = ""  # why it could not be read (then nothing is claimed about it)


class ReviewState(BaseModel):
    head_sha: str
    checks: Literal["pending", "success", "failure"]  # the REQUIRED checks (minus operator overrides)
    failing_checks: list[str] = Field(default_factory=list)  # required checks that failed
    changes_requested: bool = False  # a reviewer with write access requests changes
    approvals: int = 0
    merged: bool = False
    merge_commit: str | None = None
    # Where the required set came from (branch protection / rulesets / configuration) and what it is;
    # optional checks are shown, never blocking. (Defaults: states recorded before the merge gate read them.)
    required_checks: list[str] = Field(default_factory=list)
    required_source: str = ""
    pending_checks: list[str] = Field(default_factory=list)  # required checks not finished or not reported
    optional_failing: list[str] = Field(default_factory=list)
    overridden: list[str] = Field(default_factory=list)  # required checks an operator overrode
    blocking_reviewers: list[str] = Field(default_factory=list)  # CHANGES_REQUESTED with write access
    ignored_reviewers: list[str] = Field(default_factory=list)  # CHANGES_REQUESTED without write access
    github_approval: GitHubApproval | None = None
    # What someone else did outside the service (defaults: states recorded before these were read).
    state: Literal["open", "closed"] = "open"
    head_ref: str | None = None  # the PR's head branch (the build branch)
    merged_by: str | None = None  # login that merged it, when GitHub says
    closed_by: str | None = None  # login that closed it, when GitHub says (the issue's closed_by)
    closed_at: str | None = None
    branch_deleted: bool = False  # the head branch no longer exists
    registry_drift: list[RegistryDrift] = Field(default_factory=list)  # pinned images changed since validation
    foreign_head: ForeignHead | None = None  # the head is not the pin commit (read when the pin is known)
    mergeable: bool | None = None  # GitHub's answer for an open PR (None: not computed yet, or not asked)
    base_sha: str | None = None  # the base branch head GitHub compared with
    merge_refused: str = ""  # GitHub's refusal of the merge call (405), as it said it
    merged_pins: MergedPins | None = None  # merged: what its pin table holds (read when the images are known)


class ConflictInput(BaseModel):
    """The PR cannot merge: what the service needs to judge main's new commits and rebase its own pin commit."""

    request_id: str
    branch: str
    pr_number: int | None = None  # closed with a comment when superseded (None: left as it is)
    base_commit: str  # main when the build started
    build_commit: str
    harbor_commit: str
    pin_commit: str  # the PR head now (the service's pin commit): the lease of a rebased push
    targets: list[TargetResult] = Field(default_factory=list)


class ConflictVerdict(BaseModel):
    """How main's new commits stand against this build (activities/record.resolve_conflict)."""

    kind: Literal["superseded", "rebuild", "rebased", "foreign_conflict"]
    main_commit: str
    detail: str  # one sentence, shown in the wait or the end
    superseded_by: str | None = None  # the build (request id, else the commit) whose pins main holds
    pin_commit: str | None = None  # rebased: the new pin commit now at the PR head
    reasons: list[str] = Field(default_factory=list)  # the rebuild boundary's reasons, or the conflicting files


class WatchInput(BaseModel):
    pr_number: int
    return_after_s: float = 50.0
    last: ReviewState | None = None
    overrides: list[str] = Field(default_factory=list)  # required checks an operator overrode
    authorized: bool = False  # an authorization waits for green: poll at the faster cadence
    images: list[PinnedImage] = Field(default_factory=list)  # checked in the registry while the PR waits
    known_drift: list[RegistryDrift] = Field(default_factory=list)  # as last reported (also when ``last`` is None)
    request_id: str = ""  # names the PR comment that reports registry drift
    pin_commit: str | None = None  # the head the service pushed: any other head is reported as foreign


class GitHubWake(BaseModel):
    """A GitHub webhook said this build's PR may have changed (``BuildPipelineWorkflow.github_changed``):
    the merge wait's watch reads GitHub again now. Never the gate state itself."""

    event: str  # check_run, check_suite, status, pull_request, pull_request_review
    delivery: str  # X-GitHub-Delivery (the receiver wakes once per delivery)
    pr_number: int | None = None  # when the event names PRs: this build's, else it is ignored
    head_sha: str | None = None


class MergeAuthorization(BaseModel):
    """Who authorized the merge and how it was verified. The caller fills ``by``/``note`` and the override;
    the worker fills the rest (configured operator, Temporal identity of the update's caller)."""

    by: str
    note: str = ""
    override_checks: list[str] = Field(default_factory=list)  # required checks merged over, with reason
    reason: str = ""  # why the overridden checks do not block (required with override_checks)
    via: Literal["temporal", "github-review", "github-comment"] = "temporal"
    verified: str = ""  # "config:operators.logins" or "team org/slug"; empty = not verified (older runs)
    temporal_identity: str | None = None  # the identity the server recorded for the update's caller
    head_sha: str | None = None  # the PR head when authorized: a new head needs a new authorization
    update_id: str | None = None
    comment_url: str | None = None  # the PR comment recording it


class MergeInput(BaseModel):
    pr_number: int
    head_sha: str
    authorization: MergeAuthorization | None = None  # re-verified by the merge activity (None: older runs)
    images: list[PinnedImage] = Field(default_factory=list)  # checked once more right before merging


class AuthorizeInput(BaseModel):
    """An operator command to verify on the worker: the name against the configured operators, the
    caller's Temporal identity from the server's record of the update, and (approve-merge) the PR comment."""

    kind: Literal["approve-merge", "decide"]
    by: str
    update_id: str | None = None
    pr_number: int | None = None
    request_id: str = ""
    authorization: MergeAuthorization | None = None  # approve-merge: what to record in the PR
    detail: str = ""  # decide: "<target> retry"


class VerifiedOperator(BaseModel):
    login: str
    verified: str  # "config:operators.logins" or "team org/slug"
    temporal_identity: str | None = None
    comment_url: str | None = None


# ---------------------------------------------------------------- the final report


class PipelineReport(BaseModel):
    workflow_id: str
    status: Literal["running", "planned", "failed", "cancelled", "awaiting_merge", "merged"]
    request: BuildRequest
    workflow_url: str | None = None
    state: BuildState | None = None
    source: SourceSnapshot | None = None
    plan: list[TargetSpec] = Field(default_factory=list)
    preflight: PreflightReport | None = None  # what was proven before the first side effect
    targets: list[TargetResult] = Field(default_factory=list)
    pull_request: PullRequestInfo | None = None
    review: ReviewState | None = None  # checks and reviews as last seen while awaiting merge
    # The standing merge authorization: who, how verified, the caller's Temporal identity, overrides.
    merge_authorization: MergeAuthorization | None = None
    merge_commit: str | None = None
    message: str = ""
    failure: FailureInfo | None = None  # set when status is failed or cancelled
    waiting: list[WaitingReason] = Field(default_factory=list)  # what the build waits for right now


# ---------------------------------------------------------------- scheduled rebuild check


class RebuildCheckInput(BaseModel):
    request: BuildRequest
    start_pipeline: bool = True
    # `schedule trigger --force`: start the rebuild even though an operator cancelled it for these inputs.
    force: bool = False


class RebuildDecision(BaseModel):
    needed: bool
    reasons: list[str]
    source_commit: str
    harbor_commit: str
    last_source_commit: str | None
    last_harbor_commit: str | None
    changed_paths: list[str] = Field(default_factory=list)
    # The (arch-variant) keys a change crossing the boundary reached since their own pins; the started
    # pipeline builds these (the smallest architecture × variant request covering them).
    rebuild_targets: list[str] = Field(default_factory=list)


class RebuildCheckResult(BaseModel):
    decision: RebuildDecision
    pipeline_workflow_id: str | None = None
    started: bool = False
    note: str = ""
    # An operator's `cancel` of the rebuild for these very inputs: remembered (not restarted) until the
    # source or Harbor commit changes, or `schedule trigger --force`.
    held_by_cancel: str = ""


class MergeWaitState(BaseModel):
    """What a continued pipeline run carries into the merge wait: bounded, whatever the wait's length.

    The report (plan, validated targets, PR, last review) is the build's record; the rest is the
    operator's pending authorization and the targets' last briefs for the UI."""

    report: PipelineReport
    merge_auth: MergeAuthorization | None = None
    targets: list[TargetBrief] = Field(default_factory=list)
    merge_wait_since: str | None = None  # ISO time the wait began (operator-wait metric)
    runs: int = 1  # runs so far in this merge wait


PipelineInput.model_rebuild()
TargetInput.model_rebuild()
