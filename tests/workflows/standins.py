"""Scripted stand-ins for every activity the pipeline and target workflows call, registered by name.

Why scripted rather than real: these tests are about the workflows' decisions (retry, wait, refuse,
merge), so each test says what Iris, the log, the registry and GitHub "answer" and then asserts what
the REAL workflows did with it. The answers are real domain models, and failure classes come from the
real classifier (``domain.failures.classify``) fed with the kind of evidence the capture activity sees.
Every call is recorded in ``calls`` (activity name, input) for assertions.
"""

from __future__ import annotations

import asyncio
import datetime
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Literal

from temporalio import activity
from temporalio.client import Client, WorkflowHandle
from temporalio.exceptions import ApplicationError
from temporalio.worker import Worker

from activities.merge_gate import caller_identity
from domain.buildset import BuildRequest, CompatibilityRequest, TargetSpec, plan_targets
from domain.config import OperatorSettings, PolicySettings, ServiceConfig
from domain.failures import Evidence, classify
from domain.jobs import submission_name
from domain.models import (
    AdoptInput,
    AdoptResult,
    AuthorizeInput,
    BuildState,
    BundleSummary,
    CapturedFailure,
    CaptureInput,
    FileRef,
    JobProgress,
    LoadStateInput,
    LogCheck,
    LogCheckInput,
    MergeInput,
    MonitorInput,
    PlanTargetsInput,
    PreflightCheck,
    PreflightInput,
    PreflightReport,
    PrepareSourceInput,
    PullRequestInfo,
    RecordInput,
    ReviewState,
    SourceSnapshot,
    SubmitInput,
    SubmittedJob,
    TargetInput,
    TargetResult,
    TerminateInput,
    ValidateInput,
    VerifiedOperator,
    WatchInput,
)
from domain.validation import CheckResult, ValidationReport
from domain.watch import WatchJobInput
from tests.contract.helpers import COMMIT, HARBOR, contract
from workflows.pipeline import BuildPipelineWorkflow
from workflows.target import TargetBuildWorkflow

RESULT_TIMEOUT_S = 60  # every wait on a workflow is bounded: a broken workflow fails instead of hanging
MERGE_COMMIT = "c" * 40
PR_HEAD = "d" * 40
DIGEST = "sha256:" + "e" * 64
OPERATORS = {"ana", "bob", "history", "tester"}  # the configured operators of these tests

# Evidence as the capture activity would assemble it for each failure kind (classified for real).
PREEMPTED = Evidence(job_state="worker_failed", k8s_event_reasons=["EvictedDueToPreempted"],
                     log_tail=["INFO[0420] Taking snapshot of full filesystem..."])
MANIFEST_MISMATCH = Evidence(job_state="failed", error="exit code 1",
                             log_tail=["ERROR: wheelhouse MANIFEST differs from expected-wheel-manifest.txt"])
UNKNOWN = Evidence(job_state="failed", error="exit code 3")


def watcher_config(tmp_path, cluster: str, policy: PolicySettings | None = None) -> ServiceConfig:
    """A worker config with one stand-in cluster, for the watcher tests (their controller is a stand-in
    transport; the URL is never dialled)."""
    return ServiceConfig.model_validate({
        "work_dir": str(tmp_path),
        "repos": {"marinskyrl_url": "file:///nowhere", "harbor_url": "file:///nowhere"},
        "clusters": {cluster: {"controller_url": "https://standin.invalid",
                               "client_revision_date": datetime.date.today().isoformat()}},
        "registry": {"image_repository": "127.0.0.1:5000/gpu-rl", "user": {"kind": "literal_public", "value": "u"},
                     "token": {"kind": "env", "name": "X"}},
        **({"policy": policy.model_dump()} if policy is not None else {}),
    })


def request(archs=("amd64",), variants=("standard",)) -> BuildRequest:
    return BuildRequest(architectures=list(archs), variants=list(variants),
                        compatibility_request=CompatibilityRequest(requested_by="tester", reason="workflow test"))


def plan(req: BuildRequest | None = None) -> list[TargetSpec]:
    """Real targets planned from the sandbox fixture contract at COMMIT."""
    return plan_targets(contract(), req or request(), build_commit=COMMIT, harbor_commit=HARBOR,
                        cluster_archs=None, image_repository_override=None)


def target_input(request_id: str, target: TargetSpec | None = None) -> TargetInput:
    return TargetInput(request_id=request_id, target=target or plan()[0], build_commit=COMMIT,
                       harbor_commit=HARBOR, branch=f"gpu-rl-build/{request_id}")


def validation(target: TargetSpec, kind: Literal["pass", "blocked", "fail", "inconclusive"]) -> ValidationReport:
    """A report that is ok, blocked only on anonymous pull, failing on the platform check, or inconclusive
    (the registry answered 503 for the tag, as ``clients.image_validator`` reports it)."""
    if kind == "inconclusive":
        checks = [CheckResult(name="digest", expected=f"digest of tag {target.tag}",
                              observed="registry error (RegistryUnavailable)", verdict="inconclusive")]
        return ValidationReport(image_ref=target.image_repository, tag=target.tag, digest=None, platform=None,
                                layer_count=None, largest_layer_bytes=None, total_bytes=None, anonymous_pull=None,
                                labels={}, checks=checks)
    platform = target.kaniko_platform
    anon = "not_anonymously_pullable" if kind == "blocked" else "pullable"
    checks = [
        CheckResult(name="platform", expected=platform, observed=platform if kind != "fail" else "linux/s390x",
                    verdict="fail" if kind == "fail" else "pass"),
        CheckResult(name="layers", expected=">= 20", observed="42", verdict="pass"),
        CheckResult(name="anonymous_pull", expected="pullable", observed=anon,
                    verdict="fail" if kind == "blocked" else "pass"),
    ]
    return ValidationReport(image_ref=target.image_repository, tag=target.tag, digest=DIGEST, platform=platform,
                            layer_count=42, largest_layer_bytes=1_000_000, total_bytes=9_000_000,
                            anonymous_pull=anon, labels={}, checks=checks)


def review(checks: str = "success", *, changes_requested: bool = False, failing: list[str] | None = None,
           head: str = PR_HEAD) -> ReviewState:
    return ReviewState(head_sha=head, checks=checks, failing_checks=failing or [],
                       changes_requested=changes_requested)


@dataclass
class Round:
    """What one submission of a target ends as."""

    state: str = "succeeded"  # terminal Iris state the watcher reports (monitor_job for pre-watcher runs)
    pending_for_s: float = 0.0  # >0: the job sits pending this long (workflow time), nobody wakes the target
    missing: list[str] = field(default_factory=list)  # markers absent from the log (state succeeded)
    final_push: bool = True
    evidence: Evidence | None = None  # what capture_failure classifies; None: missing-marker evidence
    log_error: tuple[str, str] | None = None  # check_build_log fails for good: (ActivityFailure type, message)
    lost: list[str] = field(default_factory=list)  # check_build_log's log_lost reasons (missing markers unproven)
    lost_cause: str = "log"  # check_build_log: "cache" where every unproven marker's step was a kaniko cache hit
    stood_in: dict[str, str] = field(default_factory=dict)  # markers the image proved for an incomplete log
    contradicted: list[str] = field(default_factory=list)  # check_build_log: own-output lines against the plan
    image_digest: str | None = None  # check_build_log: the registry digest the image judgement relied on


class Standins:
    """Answers per target key: ``rounds`` (one per submission) and ``validations`` (in order, last repeats)."""

    def __init__(self, *, rounds: dict[str, list[Round]] | None = None,
                 validations: dict[str, list[str]] | None = None, reviews: list[ReviewState] | None = None,
                 policy: PolicySettings | None = None, targets: list[TargetSpec] | None = None,
                 operators: set[str] | None = None):
        self.rounds = rounds or {}
        self.validations = validations or {}
        self.review_now = (reviews or [review()])[0]  # the PR as GitHub shows it now; see set_review
        self.policy_settings = policy or PolicySettings()
        self.targets = targets
        self.plan_error: str | None = None  # plan_targets raises this as a non-retryable InputError
        self.override_answer: ReviewState | None = None  # what the watch reports given an operator's overrides
        self.operators = set(operators if operators is not None else OPERATORS)  # configured operator logins
        self.calls: list[tuple[str, object]] = []
        self.hold: dict[str, asyncio.Event] = {}  # activity name -> released when set
        self.entered: dict[str, asyncio.Event] = {}  # activity name -> set when a call starts
        self._jobs: dict[str, tuple[str, int]] = {}  # job id -> (target key, round)
        self.submitted: list[str] = []  # job ids in submission order
        self._first_watch: dict[str, float] = {}  # job id -> workflow time (epoch s) of its first watch_job
        self._validated: dict[str, int] = {}
        self.adoptable: dict[str, TargetResult] = {}  # target key -> the earlier validated result to adopt

    def set_review(self, state: ReviewState) -> None:
        """Change the PR's checks/reviews; a watch waiting for a change returns it."""
        self.review_now = state

    def names(self, name: str) -> list[object]:
        return [inp for n, inp in self.calls if n == name]

    async def _enter(self, name: str, inp: object) -> None:
        self.calls.append((name, inp))
        self.entered.setdefault(name, asyncio.Event()).set()
        if name in self.hold:
            await self.hold[name].wait()

    def _round(self, job_id: str) -> Round:
        key, r = self._jobs[job_id]
        script = self.rounds.get(key, [Round()])
        return script[min(r, len(script) - 1)]

    # ------------------------------------------------------------------ target activities
    @activity.defn(name="policy")
    async def policy(self) -> PolicySettings:
        await self._enter("policy", None)
        return self.policy_settings

    @activity.defn(name="submit_job")
    async def submit_job(self, inp: SubmitInput) -> SubmittedJob:
        await self._enter("submit_job", inp)
        name = submission_name(inp.target.job.job_name, generation=inp.generation, round_=inp.round)
        job_id = f"/tester/{name}"  # the naming rule of activities.build.submit_job
        self._jobs[job_id] = (inp.target.key, inp.round)
        self.submitted.append(job_id)
        return SubmittedJob(job_id=job_id, cluster=inp.target.cluster, attached=False, submitted_at_ms=1)

    @activity.defn(name="monitor_job")
    async def monitor_job(self, inp: MonitorInput) -> JobProgress:
        """First poll of a job: still running (cursor 7); the next: the scripted terminal state."""
        await self._enter("monitor_job", inp)
        if inp.log_cursor == 0:
            return JobProgress(job_id=inp.job_id, state="running", terminal=False, log_cursor=7,
                               last_marker="step 1")
        state = self._round(inp.job_id).state
        return JobProgress(job_id=inp.job_id, state=state, terminal=True, log_cursor=inp.log_cursor + 3,
                           last_marker=inp.last_marker)

    @activity.defn(name="watch_job")
    async def watch_job(self, inp: WatchJobInput) -> JobProgress:
        """Plays the target's side of the cluster watcher. First call: the job runs (marker "step 1") and
        the watcher wakes the target with the scripted terminal state. A ``pending_for_s``
        job stays pending and nobody wakes the target; its safety re-checks answer pending until that much
        workflow time has passed, then the scripted terminal state."""
        await self._enter("watch_job", inp)
        now = activity.info().current_attempt_scheduled_time.timestamp()
        first = self._first_watch.setdefault(inp.job_id, now)
        r = self._round(inp.job_id)
        done = JobProgress(job_id=inp.job_id, state=r.state, terminal=True, last_marker="step 1")
        if r.pending_for_s:
            if now - first < r.pending_for_s:
                return JobProgress(job_id=inp.job_id, state="pending", terminal=False,
                                   pending_reason="Scheduler: Insufficient CPU")
            return done
        if inp.known is None:
            # The wake-up is sent before this activity returns: with nothing in flight, the time-skipping
            # server would otherwise skip time while the signal is on its way.
            await activity.client().get_workflow_handle(inp.workflow_id).signal("job_changed", done)
            return JobProgress(job_id=inp.job_id, state="running", terminal=False, last_marker="step 1")
        return done

    @activity.defn(name="check_build_log")
    async def check_build_log(self, inp: LogCheckInput) -> LogCheck:
        await self._enter("check_build_log", inp)
        r = self._round(inp.job_id)
        if r.log_error:
            raise ApplicationError(r.log_error[1], type=r.log_error[0], non_retryable=True)
        return LogCheck(log=_ref(f"{inp.job_id}.log"), found=list(r.stood_in), missing=list(r.missing),
                        final_push_seen=r.final_push, pushed_digest=DIGEST if r.final_push and not r.image_digest else None,
                        lost=list(r.lost), stood_in=dict(r.stood_in), contradicted=list(r.contradicted),
                        lost_cause=r.lost_cause,
                        image_digest=r.image_digest,
                        incomplete=["the log store holds no line of the job"] if r.lost or r.stood_in else [])

    @activity.defn(name="capture_failure")
    async def capture_failure(self, inp: CaptureInput) -> CapturedFailure:
        await self._enter("capture_failure", inp)
        ev = self._round(inp.job_id).evidence or Evidence(job_state="succeeded", missing_markers=inp.missing_markers,
                                                          log_lost=inp.log_lost,
                                                          log_lost_cause=inp.log_lost_cause,
                                                          contradicted=inp.contradicted)
        return CapturedFailure(classification=classify(ev),
                               diagnostics=_ref(f"evidence/{inp.job_id.rsplit('/', 1)[-1]}.diagnostics.json"))

    @activity.defn(name="validate_image")
    async def validate_image(self, inp: ValidateInput) -> ValidationReport:
        await self._enter("validate_image", inp)
        key = inp.target.key
        script = self.validations.get(key, ["pass"])
        n = self._validated[key] = self._validated.get(key, 0) + 1
        return validation(inp.target, script[min(n - 1, len(script) - 1)])

    @activity.defn(name="adopt_validated")
    async def adopt_validated(self, inp: AdoptInput) -> AdoptResult:
        await self._enter("adopt_validated", inp)
        done = self.adoptable.get(inp.target.key)
        if done is None:
            return AdoptResult(reason="no earlier run of this target")
        return AdoptResult(result=done.model_copy(update={"adopted_from": f"earlier run of {inp.target.key}"}),
                           reason="validated earlier")

    @activity.defn(name="terminate_jobs")
    async def terminate_jobs(self, inp: TerminateInput) -> list[str]:
        await self._enter("terminate_jobs", inp)
        return list(inp.job_ids)

    # ------------------------------------------------------------------ pipeline activities
    @activity.defn(name="load_build_state")
    async def load_build_state(self, inp: LoadStateInput) -> BuildState:
        await self._enter("load_build_state", inp)
        return BuildState(base_commit=COMMIT, default_branch="main", harbor_commit=HARBOR,
                          harbor_pinned={"docker/Dockerfile.gpu-rl": HARBOR}, architectures=["amd64", "arm64"],
                          policies=[], disagreements=[])

    @activity.defn(name="prepare_source")
    async def prepare_source(self, inp: PrepareSourceInput) -> SourceSnapshot:
        await self._enter("prepare_source", inp)
        return _snapshot(inp)

    @activity.defn(name="publish_source")
    async def publish_source(self, inp: PrepareSourceInput) -> SourceSnapshot:
        await self._enter("publish_source", inp)
        return _snapshot(inp.model_copy(update={"push": True}))

    @activity.defn(name="plan_targets")
    async def plan_targets(self, inp: PlanTargetsInput) -> list[TargetSpec]:
        await self._enter("plan_targets", inp)
        if self.plan_error:
            raise ApplicationError(self.plan_error, type="InputError", non_retryable=True)
        return self.targets if self.targets is not None else plan(inp.request)

    @activity.defn(name="preflight")
    async def preflight(self, inp: PreflightInput) -> PreflightReport:
        await self._enter("preflight", inp)
        return PreflightReport(checks=[PreflightCheck(name="credential", config_key="registry.token", ok=True,
                                                      detail="read", fingerprint="sha256:0123456789ab")])

    @activity.defn(name="record_artifact")
    async def record_artifact(self, inp: RecordInput) -> PullRequestInfo:
        await self._enter("record_artifact", inp)
        return PullRequestInfo(number=7, url="http://github.invalid/pull/7", head_sha=PR_HEAD)

    @activity.defn(name="watch_pull_request")
    async def watch_pull_request(self, inp: WatchInput) -> ReviewState:
        """Like the real watch: return at once without ``last``, else on a change or after a short while
        (the real one gives up after ``return_after_s``). Never blocks long: a watch still running when
        its workflow ends would stall the time-skipping server's clock for later tests."""
        await self._enter("watch_pull_request", inp)
        now = self.override_answer if inp.overrides and self.override_answer is not None else self.review_now
        for _ in range(15):
            if inp.last is None or now != inp.last:
                break
            activity.heartbeat()
            await asyncio.sleep(0.02)
            now = self.override_answer if inp.overrides and self.override_answer is not None else self.review_now
        return now

    @activity.defn(name="merge_pull_request")
    async def merge_pull_request(self, inp: MergeInput) -> ReviewState:
        """Like the real merge: only for an authorization by a configured operator."""
        await self._enter("merge_pull_request", inp)
        if inp.authorization is None or not OperatorSettings(logins=sorted(self.operators)).lists(inp.authorization.by):
            return self.review_now
        return ReviewState(head_sha=inp.head_sha, checks="success", merged=True, merge_commit=MERGE_COMMIT)

    @activity.defn(name="authorize_operator")
    async def authorize_operator(self, inp: AuthorizeInput) -> VerifiedOperator:
        """The real check's decision (configured logins) and the real identity lookup (the server's record)."""
        await self._enter("authorize_operator", inp)
        if not OperatorSettings(logins=sorted(self.operators)).lists(inp.by):
            raise ApplicationError(f"--by {inp.by}: not a configured operator (operators.logins / operators.teams)",
                                   type="NotAuthorized", non_retryable=True)
        return VerifiedOperator(login=inp.by, verified="config:operators.logins",
                                temporal_identity=await caller_identity(inp.update_id),
                                comment_url=f"http://github.invalid/pull/7#comment-{len(self.calls)}"
                                if inp.kind == "approve-merge" else None)

    def all(self) -> list:
        return [self.policy, self.submit_job, self.monitor_job, self.watch_job, self.check_build_log,
                self.capture_failure,
                self.validate_image, self.terminate_jobs, self.adopt_validated, self.load_build_state, self.prepare_source,
                self.publish_source, self.preflight,
                self.plan_targets, self.record_artifact, self.watch_pull_request, self.merge_pull_request,
                self.authorize_operator]


def _snapshot(inp: PrepareSourceInput) -> SourceSnapshot:
    return SourceSnapshot(build_commit=COMMIT, base_commit=inp.base_commit, branch=f"gpu-rl-build/{inp.request_id}",
                          pushed=inp.push, created_commit=False, harbor_commit=inp.harbor_commit,
                          harbor_diff=None, changed_files=[], ops_doc_corrected=False,
                          bundle=BundleSummary(sha256="f" * 64, size_bytes=1024, file_count=3))


def _ref(path: str) -> FileRef:
    return FileRef(path=path, sha256="0" * 64, size_bytes=10)


def worker(client: Client, task_queue: str, standins: Standins) -> Worker:
    """A worker running the real workflows with the stand-in activities."""
    return Worker(client, task_queue=task_queue, workflows=[BuildPipelineWorkflow, TargetBuildWorkflow],
                  activities=standins.all())


async def result(handle: WorkflowHandle, timeout: float = RESULT_TIMEOUT_S):
    return await asyncio.wait_for(handle.result(), timeout)


async def eventually(predicate, *, what: str, attempts: int = 400, interval: float = 0.05):
    """Poll an async predicate until truthy (bounded by attempts, never a timed assertion)."""
    for _ in range(attempts):
        value = await predicate()
        if value:
            return value
        await asyncio.sleep(interval)
    raise AssertionError(f"gave up waiting for {what}")


ONE_MINUTE = timedelta(seconds=61)
