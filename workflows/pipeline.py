"""The whole runbook as one workflow: load state, prepare source, plan, build targets, record, merge.

Thin on purpose: each step is an activity (I/O) or a child workflow (one per target); this class only
sequences them, exposes progress (query, search attributes, memo) and waits for the operator where the
runbook says a human decides (merge authorization).
"""

from __future__ import annotations

import asyncio
from datetime import datetime

from temporalio import workflow
from temporalio.exceptions import (
    ActivityError,
    ApplicationError,
    ChildWorkflowError,
    FailureError,
    is_cancelled_exception,
)
from temporalio.exceptions import (
    TimeoutError as TemporalTimeoutError,
)
from temporalio.workflow import ParentClosePolicy

with workflow.unsafe.imports_passed_through():
    from activities.build import BuildActivities
    from activities.preflight import PreflightActivities
    from activities.record import RecordActivities
    from activities.source import SourceActivities
    from domain import outcome
    from domain.models import (
        AdoptInput,
        AuthorizeInput,
        BuildState,
        ConflictInput,
        ConflictVerdict,
        ForeignHead,
        GitHubWake,
        LoadStateInput,
        MergeAuthorization,
        MergeInput,
        MergeWaitState,
        PipelineInput,
        PipelineReport,
        PlanTargetsInput,
        PreflightInput,
        PrepareSourceInput,
        PullRequestInfo,
        RecordInput,
        ReviewState,
        SourceSnapshot,
        Stage,
        TargetBrief,
        TargetInput,
        TargetResult,
        TargetStatus,
        WaitingReason,
        WatchInput,
        target_workflow_id,
    )
    from runtime import search_attributes as sa
    from workflows import metrics, options, patches
    from workflows.operators import verify_operator
    from workflows.target import TargetBuildWorkflow

# The PR watch long-polls GitHub (heartbeating) and returns on any change, else after an hour: an idle
# PR costs ~6 history events an hour, and the wait continues as new long before Temporal's limits.
WATCH_RETURN_S = 3600.0


@workflow.defn
class BuildPipelineWorkflow:
    @workflow.init
    def __init__(self, inp: PipelineInput) -> None:
        self._stage = Stage.QUEUED
        self._report = PipelineReport(workflow_id=workflow.info().workflow_id, status="running",
                                      request=inp.request)
        self._merge_auth: MergeAuthorization | None = None
        self._review: ReviewState | None = None
        self._request = inp.request
        self._targets: dict[str, TargetBrief] = {}  # as last told by each target child
        self._step = "start"  # the step running now, named in a failure
        self._memo_sent = ""
        self._merge_wait_since: datetime | None = None
        self._gate = False  # this run's merge wait follows patches.MERGE_GATE (set when the wait begins)
        self._auth_seq = 0  # bumped by every accepted authorization: the PR watch wakes and re-reads
        self._github_seq = 0  # bumped by a GitHub webhook about this PR: the PR watch reads again now
        self._drift_class: str | None = None  # BuildFailureClass upserted while registry drift holds the merge
        self._merged_outside = False  # the PR was merged by a person on GitHub, not by this service
        self._wake_head: str | None = None  # the head a push / pull_request webhook named last
        self._read: ReviewState | None = None  # the gate as the last watch returned it (its next ``last``)
        self._conflict: ConflictVerdict | None = None  # how main's new commits were judged (PR cannot merge)
        self._conflict_key = ""  # the head@main it was judged for: judged again only when one of them moves

    @workflow.signal
    def target_changed(self, brief: TargetBrief) -> None:
        """A target child reports its stage: the pipeline shows ``waiting`` while any target waits."""
        self._targets[brief.key] = brief
        if self._stage in (Stage.RUNNING, Stage.WAITING):
            stage = Stage.WAITING if self._target_waits() else Stage.RUNNING
            if stage != self._stage:
                self._stage = stage
                workflow.upsert_search_attributes([sa.STAGE.value_set(stage.value)])
        self._refresh()

    @workflow.signal
    def github_changed(self, wake: GitHubWake) -> None:
        """A webhook said this PR's checks, statuses, reviews or head changed (runtime/webhooks.py): the merge
        wait's watch reads GitHub now rather than at its next poll. Only a wake-up: what the gate decides on
        is what the watch reads. An event about another PR number is ignored."""
        pr = self._report.pull_request
        if pr is None or wake.pr_number in (None, pr.number):
            self._github_seq += 1
            if wake.event in ("push", "pull_request") and wake.head_sha:
                self._wake_head = wake.head_sha  # compared with the pin commit before any merge

    def _target_waits(self) -> list[WaitingReason]:
        return [b.waiting for b in self._targets.values() if b.waiting]

    # ------------------------------------------------------------------ operator surface
    @workflow.query
    def report(self) -> PipelineReport:
        return self._report

    @workflow.query
    def stage(self) -> str:
        return self._stage.value

    @workflow.update
    async def approve_merge(self, auth: MergeAuthorization) -> str:
        """Accepted and recorded at once, whatever the checks say (the merge follows them); refused only
        for a caller who is not a configured operator (checked on the worker, not taken on trust)."""
        if not workflow.patched(patches.OPERATOR_AUTHORIZATION):
            self._merge_auth = auth
            return f"merge authorized by {auth.by}"
        pr = self._report.pull_request
        verified = await verify_operator(AuthorizeInput(
            kind="approve-merge", by=auth.by, pr_number=pr.number if pr else None,
            request_id=self._report.workflow_id, authorization=auth))
        update = workflow.current_update_info()
        auth = auth.model_copy(update={
            "verified": verified.verified, "temporal_identity": verified.temporal_identity,
            "comment_url": verified.comment_url, "update_id": update.id if update else None,
            # Bound to the head it was given for: the one last read, or (before the first read) the pin commit
            # the report shows; a different head later withdraws it.
            "head_sha": self._review.head_sha if self._review else self._pin()})
        if self._merge_auth is not None and self._merge_auth.head_sha == auth.head_sha:
            # An authorization stands: this one adds overrides (each with its reason, in the PR comment).
            auth = auth.model_copy(update={"override_checks": sorted(
                set(self._merge_auth.override_checks) | set(auth.override_checks))})
        self._merge_auth = auth
        self._auth_seq += 1
        self._show_merge_wait()
        return self._approval_message(auth)

    def _approval_message(self, auth: MergeAuthorization) -> str:
        who = f"merge authorized by {auth.by} ({auth.verified}" + (
            f"; Temporal identity {auth.temporal_identity}" if auth.temporal_identity else "") + ")"
        rev = self._review
        if rev is None:
            pin = self._pin()
            return (f"{who}; accepted and queued: the PR's checks are being read" + (
                f"; it merges the pin commit {pin[:12]} once its required checks are green" if pin else ""))
        if rev.foreign_head is not None:
            return (f"{who}; accepted, held: {outcome.head_moved_blocking(rev.foreign_head)}; only the pin commit is "
                    "merged: restore the branch (the report prints the command), then approve again")
        if rev.mergeable is False:
            return f"{who}; accepted, held: PR #{self._report.pull_request.number} cannot merge (conflicts with main); " \
                   "the report says why and the next step"
        blocking = _blocking(rev, auth.override_checks)
        if rev.registry_drift:
            return (f"{who}; accepted, held: {blocking}; it merges once the registry serves the validated "
                    "image(s) again and the required checks are green")
        if not blocking:
            return f"{who}; required checks are green as last seen: merging now"
        if rev.checks == "failure" and not set(rev.failing_checks) <= set(auth.override_checks):
            return (f"{who}; accepted, waiting: {blocking}; it merges when they turn green, or approve again with "
                    "--override-check NAME --reason TEXT")
        return f"{who}; accepted and queued: {blocking}; it merges as soon as they are green"

    @approve_merge.validator
    def _validate_approve(self, auth: MergeAuthorization) -> None:
        if not auth.by.strip():
            raise ValueError("approve-merge needs the name of the operator who authorizes it (--by)")
        if auth.override_checks and not auth.reason.strip():
            raise ValueError("--override-check needs --reason (it is recorded in the PR)")
        if self._review is not None and self._review.merged:
            raise ValueError(f"PR already merged ({self._review.merge_commit})")
        if self._stage != Stage.AWAITING_MERGE or (self._review is None and not (self._gate and self._pin())):
            raise ValueError(f"nothing to merge yet (stage {self._stage.value})")
        if self._merge_auth is not None and (not auth.override_checks or not self._gate):
            raise ValueError(f"merge already authorized by {self._merge_auth.by}")
        if not self._gate:  # a run from before the merge gate: its merge wait drops authorizations given early
            if self._review.checks != "success":
                failing = ", ".join(self._review.failing_checks) or "none reported yet"
                raise ValueError(f"required checks are {self._review.checks} (failing: {failing}); refusing to merge")
            if self._review.changes_requested:
                raise ValueError("a reviewer requested changes; refusing to merge")

    # ------------------------------------------------------------------ the run
    @workflow.run
    async def run(self, inp: PipelineInput) -> PipelineReport:
        """Every way this ends is recorded by the workflow itself (report, memo, search attributes, UI)."""
        # Started without BuildKind (not by the starter, e.g. by a rebuild check): tag itself (patched).
        if workflow.info().typed_search_attributes.get(sa.KIND) is None and workflow.patched(patches.BUILD_KIND):
            kind = sa.BuildKind.PLAN if inp.plan_only else sa.BuildKind.BUILD
            workflow.upsert_search_attributes([sa.KIND.value_set(kind.value)])
        try:
            return await self._run(inp)
        except BaseException as e:
            if isinstance(e, asyncio.CancelledError) or is_cancelled_exception(e):
                await self._finish(Stage.CANCELLED, "cancelled", outcome.cancelled(inp.request))
                raise
            if isinstance(e, ApplicationError) and e.type == "BuildFailed":
                raise  # targets failed: already recorded by _run
            if not isinstance(e, FailureError):
                raise  # a bug in this code: fail the task (fix and redeploy), never the build
            error_type, message = _error_of(e)
            after_validation = self._stage in (Stage.RECORDING, Stage.AWAITING_MERGE, Stage.MERGING)
            failure = outcome.step_failure(error_type, message, step=self._step, request=inp.request,
                                           resume_id=workflow.info().workflow_id if after_validation else None,
                                           plan=inp.plan_only)
            await self._finish(Stage.FAILED, "failed", failure)
            # The failure message itself carries the next step: it is what the UI shows without opening JSON.
            raise ApplicationError(f"{failure.message} — next step: {failure.next_step}", self._report,
                                   type="BuildFailed", non_retryable=True) from e

    async def _finish(self, stage: Stage, status: str, failure) -> None:
        rep = self._report
        rep.status = status
        rep.failure = failure
        rep.waiting = []
        rep.message = f"{failure.message} — next step: {failure.next_step}"
        self._stage = stage
        workflow.upsert_search_attributes([sa.STAGE.value_set(stage.value),
                                           sa.FAILURE_CLASS.value_set(sa.keyword(failure.failure_class))])
        self._refresh()

    async def _run(self, inp: PipelineInput) -> PipelineReport:
        if inp.resume is not None:  # a run continued while waiting for the merge
            return await self._await_merge(inp, self._resume(inp.resume))
        rep = self._report
        await self._set_stage(Stage.LOADING)
        state: BuildState = await workflow.execute_activity_method(
            SourceActivities.load_build_state,
            LoadStateInput(request_id=inp.request_id, source_commit=inp.source_commit,
                           harbor_ref=inp.harbor_commit or inp.request.harbor_ref),
            **options.LOAD_STATE,
            summary="fetch MarinSkyRL and Harbor, read AGENTS.md, the ops file, the build script and Dockerfiles")
        rep.state = state

        await self._set_stage(Stage.PREPARING_SOURCE)
        prepare = PrepareSourceInput(request_id=inp.request_id, base_commit=state.base_commit,
                                     harbor_commit=state.harbor_commit, push=False, plan_only=inp.plan_only,
                                     allow_suspicious_files=inp.request.allow_suspicious_files)
        source: SourceSnapshot = await workflow.execute_activity_method(
            SourceActivities.prepare_source,
            prepare, **options.PREPARE_SOURCE,
            summary="re-pin Harbor in every Dockerfile, commit locally, check the Iris bundle")
        rep.source = source
        workflow.upsert_search_attributes([sa.SOURCE_COMMIT.value_set(sa.keyword(source.build_commit)),
                                           sa.HARBOR_COMMIT.value_set(sa.keyword(source.harbor_commit))])

        await self._set_stage(Stage.PLANNING)
        rep.plan = await workflow.execute_activity_method(
            SourceActivities.plan_targets,
            PlanTargetsInput(request=inp.request, build_commit=source.build_commit,
                             harbor_commit=source.harbor_commit, request_id=inp.request_id,
                             base_commit=state.base_commit, plan_only=inp.plan_only),
            **options.PLAN_TARGETS,
            summary="resolve clusters and job specs for every (architecture, variant) from the build contract")
        self._refresh()
        if not inp.plan_only:
            # Every check before the first side effect: credentials, permissions, tools, Iris, script.
            # (patched: runs started before preflight existed replay without it)
            if workflow.patched(patches.PREFLIGHT):
                self._step = "preflight: proving credentials, permissions, tools, Iris and the build script"
                rep.preflight = await workflow.execute_activity_method(
                    PreflightActivities.preflight,
                    PreflightInput(request_id=inp.request_id, base_commit=state.base_commit,
                                   build_commit=source.build_commit, changed_files=source.changed_files,
                                   targets=rep.plan, issue_url=inp.request.issue_url),
                    **options.PREFLIGHT,
                    summary="prove credentials, permissions, tools, Iris and the build script before any side effect")
            self._step = "publishing the build branch"
            # Only a fully planned build publishes its commit: a bad request leaves no stray branch.
            rep.source = source = await workflow.execute_activity_method(
                SourceActivities.publish_source, prepare, **options.PUBLISH_SOURCE,
                summary=f"push the build branch at {source.build_commit[:12]}")
        if inp.plan_only:
            rep.status = "planned"
            rep.message = f"plan for {source.build_commit[:12]}: {len(rep.plan)} target(s); nothing submitted"
            await self._set_stage(Stage.PLANNED)
            return rep

        await self._set_stage(Stage.RUNNING)
        results = await asyncio.gather(*(self._run_target(inp, source, t) for t in rep.plan))
        rep.targets = list(results)
        failed = [r for r in results if r.status != "validated"]
        self._refresh()
        if failed:
            classes = [self._targets[r.key].failure_class for r in failed
                       if r.key in self._targets and self._targets[r.key].failure_class]
            classes += [r.failures[-1].failure_class for r in failed if r.failures]
            failure = outcome.targets_failure([r.message for r in failed], classes, inp.request,
                                              workflow_id=workflow.info().workflow_id)
            await self._finish(Stage.FAILED, "failed", failure)
            rep.message = failure.message
            # Nothing is pinned or proposed for a build set with a failed target.
            raise ApplicationError(f"{rep.message} — next step: {failure.next_step}", rep, type="BuildFailed",
                                   non_retryable=True)

        await self._set_stage(Stage.RECORDING)
        pr = await workflow.execute_activity_method(
            RecordActivities.record_artifact,
            RecordInput(request_id=inp.request_id, request=inp.request, source=source, targets=rep.targets,
                        workflow_url=None),
            **options.RECORD,
            summary="update the pin table, commit, open or update the PR and post the evidence")
        rep.pull_request = pr
        rep.status = "awaiting_merge"

        await self._set_stage(Stage.AWAITING_MERGE)
        return await self._await_merge(inp, pr)

    async def _await_merge(self, inp: PipelineInput, pr: PullRequestInfo) -> PipelineReport:
        """Watch the PR until merged; merge once an operator authorized it and checks are green.

        Review can take weeks: once this run's history reaches ``merge_wait_events_per_run``, the wait
        continues as a new run carrying only ``MergeWaitState``, so no run nears Temporal's limits."""
        if workflow.patched(patches.MERGE_GATE):
            self._gate = True
            return await self._await_merge_gated(inp, pr)
        rep = self._report
        watch_cancelled = False
        while True:
            # Continue as new between two completed watches only (never with a cancelled watch still
            # settling, right after an authorization arrived): the next run starts a fresh watch.
            if not watch_cancelled and self._history_is_long(inp) and workflow.patched(
                    patches.MERGE_WAIT_CONTINUE_AS_NEW):
                await workflow.wait_condition(workflow.all_handlers_finished)
                workflow.continue_as_new(inp.model_copy(update={"resume": self._merge_wait_state(inp)}))
            # Watch checks/reviews (returns on any change) while also waking at once on authorization.
            watch = asyncio.ensure_future(workflow.execute_activity_method(
                RecordActivities.watch_pull_request,
                WatchInput(pr_number=pr.number, last=None if self._merge_auth else self._review,
                           return_after_s=WATCH_RETURN_S),
                **options.watch_pull_request(WATCH_RETURN_S), summary=f"watch checks and reviews on PR #{pr.number}"))
            if self._merge_auth is None:
                authorized = asyncio.ensure_future(workflow.wait_condition(lambda: self._merge_auth is not None))
                await workflow.wait([watch, authorized], return_when=asyncio.FIRST_COMPLETED)
                if not watch.done():
                    watch.cancel()  # authorization arrived: look again right away (last=None), then merge
                    _settle_quietly(watch)
                    watch_cancelled = True
                    continue
                authorized.cancel()
            self._review = rep.review = await watch
            watch_cancelled = False
            self._show_merge_wait()
            if self._review.merged:  # merged by a human outside the service
                break
            if self._merge_auth is None:
                continue
            if self._review.checks == "success" and not self._review.changes_requested:
                await self._set_stage(Stage.MERGING)
                merged = await workflow.execute_activity_method(
                    RecordActivities.merge_pull_request,
                    MergeInput(pr_number=pr.number, head_sha=self._review.head_sha, authorization=self._merge_auth),
                    **options.MERGE,
                    summary=f"merge PR #{pr.number} at {self._review.head_sha[:12]} "
                            f"(authorized by {self._merge_auth.by})")
                self._review = rep.review = merged
                if merged.merged:
                    break
                await self._set_stage(Stage.AWAITING_MERGE)
            self._merge_auth = None  # head moved or checks went red after authorization: ask again
        return await self._merged(pr)

    async def _await_merge_gated(self, inp: PipelineInput, pr: PullRequestInfo) -> PipelineReport:
        """The merge wait with the merge gate (patches.MERGE_GATE): an authorization is accepted whenever
        it comes and stays while the required checks are pending or red; the watch wakes at once on it
        and re-reads GitHub, then returns on every change, so the merge follows the checks turning green
        without a second command. Only a new head (or a refused merge) withdraws an authorization.
        A GitHub webhook (``github_changed``) also wakes the watch, which then reads GitHub at once."""
        rep = self._report
        pin = self._pin() or pr.head_sha
        watch_cancelled, reread = False, self._merge_auth is not None
        while True:
            if not watch_cancelled and self._history_is_long(inp):
                await workflow.wait_condition(workflow.all_handlers_finished)
                workflow.continue_as_new(inp.model_copy(update={"resume": self._merge_wait_state(inp)}))
            auth = self._merge_auth
            watch = asyncio.ensure_future(workflow.execute_activity_method(
                RecordActivities.watch_pull_request,
                WatchInput(pr_number=pr.number, last=None if reread else (self._read or self._review),
                           return_after_s=WATCH_RETURN_S,
                           overrides=auth.override_checks if auth else [], authorized=auth is not None,
                           images=outcome.pinned_images(rep.targets), request_id=inp.request_id,
                           known_drift=self._review.registry_drift if self._review else [], pin_commit=pin),
                **options.watch_pull_request(WATCH_RETURN_S), summary=f"watch checks and reviews on PR #{pr.number}"))
            reread, seq, github_seq = False, self._auth_seq, self._github_seq
            woken = asyncio.ensure_future(workflow.wait_condition(
                lambda seq=seq, g=github_seq: self._auth_seq != seq or self._github_seq != g))
            await workflow.wait([watch, woken], return_when=asyncio.FIRST_COMPLETED)
            if not watch.done():
                # An authorization arrived: read GitHub again right away and report (last=None). A webhook
                # (no history before it has one): a fresh watch reads at once and returns if anything changed.
                watch.cancel()
                _settle_quietly(watch)
                watch_cancelled, reread = True, self._auth_seq != seq
                continue
            woken.cancel()
            self._review = self._read = rep.review = await watch
            watch_cancelled = False
            if self._review.merged:  # merged by a human outside the service
                self._merged_outside = True
                if self._pr_body():  # no pin table in this repository: the PR body carries the digests
                    self._review = rep.review = self._review.model_copy(update={"merged_pins": None})
                pins = self._review.merged_pins
                if pins is not None and not pins.unreadable and not pins.holds_validated:
                    await self._merged_other_head(inp, pr)  # what main pins is not this build's: ends here
                break
            if (self._review.state == "closed" or self._review.branch_deleted) and workflow.patched(
                    patches.CLOSED_OUTSIDE):
                await self._closed_outside(pr)  # closed unmerged or branch deleted by someone else: ends here
            self._show_drift()
            moved = self._review.head_sha != pin and workflow.patched(patches.MERGE_PIN_COMMIT)
            if moved and self._review.foreign_head is None:  # a watch that did not say who: still held
                self._review = rep.review = self._review.model_copy(update={"foreign_head": ForeignHead(
                    sha=self._review.head_sha, pin_commit=pin, branch=self._review.head_ref or "")})
            if self._merge_auth is None and self._review.github_approval:
                a = self._review.github_approval
                self._merge_auth = MergeAuthorization(by=a.login, via=f"github-{a.via}", verified=a.verified,
                                                      head_sha=self._review.head_sha, comment_url=a.url)
            elif self._merge_auth is not None and self._merge_auth.head_sha not in (None, self._review.head_sha):
                self._merge_auth = None  # new commits since the authorization: they need their own
            if self._review.mergeable is False and not moved and workflow.patched(patches.MERGE_CONFLICT):
                if await self._judge_conflict(inp, pr, pin):  # rebased: a new pin commit, checks run again
                    pin, reread = self._pin() or pin, True
                    continue
            self._show_merge_wait()
            auth = self._merge_auth
            if auth is None or moved or self._review.mergeable is False or _blocking(self._review, auth.override_checks):
                continue
            if self._github_seq != github_seq and self._wake_head not in (None, pin):
                continue  # a push webhook named another head since this read: read again before merging
            await self._set_stage(Stage.MERGING)
            # Only the pin commit is merged: GitHub is given its sha and refuses (409) a head moved since.
            merged = await workflow.execute_activity_method(
                RecordActivities.merge_pull_request,
                MergeInput(pr_number=pr.number, head_sha=pin, authorization=auth,
                           images=outcome.pinned_images(rep.targets)),
                **options.MERGE,
                summary=f"merge PR #{pr.number} at the pin commit {pin[:12]} (authorized by {auth.by})")
            self._review = rep.review = merged
            if merged.merged:
                break
            if merged.registry_drift:  # held, not refused: the authorization stands for when it is fixed
                self._show_drift()
                await self._set_stage(Stage.AWAITING_MERGE)
                self._show_merge_wait()
                continue
            self._merge_auth = None  # refused (head moved, conflicts, operator no longer listed): ask again
            await self._set_stage(Stage.AWAITING_MERGE)
            if merged.mergeable is False and merged.head_sha == pin and workflow.patched(patches.MERGE_CONFLICT):
                if await self._judge_conflict(inp, pr, pin):
                    pin, reread = self._pin() or pin, True
            self._show_merge_wait()
        return await self._merged(pr)

    async def _merged(self, pr: PullRequestInfo) -> PipelineReport:
        rep = self._report
        rep.merge_authorization = self._merge_auth
        pr.merged = True
        pr.merge_commit = self._review.merge_commit
        pr.merged_by = self._review.merged_by
        rep.merge_commit = self._review.merge_commit
        rep.status = "merged"
        rep.waiting = []
        if self._merged_outside:  # an operator merged it on GitHub: done, recording their merge commit
            rep.message = outcome.merged_outside_message(pr, self._review)
        else:
            rep.message = f"merged PR #{pr.number} as {rep.merge_commit}" + (
                f" (authorized by {self._merge_auth.by}, {self._merge_auth.verified})"
                if self._merge_auth and self._merge_auth.verified else "") + (
                f"; {outcome.merged_pins_text(self._review.merged_pins)}"
                if self._review.merged_pins and not self._review.merged_pins.unreadable and not self._pr_body() else "")
        if self._review.registry_drift:
            rep.message += f"; note: {outcome.drift_blocking(self._review.registry_drift)}"
        await self._set_stage(Stage.DONE)
        workflow.upsert_search_attributes([sa.FAILURE_CLASS.value_unset()])
        self._refresh()
        return rep

    async def _merged_other_head(self, inp: PipelineInput, pr: PullRequestInfo) -> None:
        """Someone merged the PR by hand and the pin table it merged does not hold the validated digests (read
        from the merge commit): the build ends saying what main pins now, never claiming its images merged."""
        pr.merged, pr.merge_commit, pr.merged_by = True, self._review.merge_commit, self._review.merged_by
        self._report.merge_commit = self._review.merge_commit
        failure = outcome.merged_other_head(self._review, pr, inp.request)
        await self._finish(Stage.CANCELLED, "cancelled", failure)
        raise ApplicationError(f"{failure.message} — next step: {failure.next_step}", self._report,
                               type="BuildFailed", non_retryable=True)

    async def _judge_conflict(self, inp: PipelineInput, pr: PullRequestInfo, pin: str) -> bool:
        """The PR cannot merge: judge main's new commits once per (head, main) and act on the verdict. Superseded
        ends the build here; rebased moves the pin commit (True: the caller reads the new head; the approval,
        given for the old tree, is withdrawn); anything else is shown as the wait's reason and next step."""
        rev, rep = self._review, self._report
        key = f"{rev.head_sha}@{rev.base_sha or '?'}"
        if key == self._conflict_key:
            return False
        self._conflict_key = key
        if rep.state is None or rep.source is None:
            return False  # a report without its base and build commits: shown as a conflict, not judged
        self._conflict = verdict = await workflow.execute_activity_method(
            RecordActivities.resolve_conflict,
            ConflictInput(request_id=inp.request_id, branch=rep.source.branch, pr_number=pr.number,
                          base_commit=rep.state.base_commit,
                          build_commit=rep.source.build_commit, harbor_commit=rep.source.harbor_commit,
                          pin_commit=pin, targets=rep.targets),
            **options.RECORD, summary=f"PR #{pr.number} cannot merge: judge main's new commits, rebase the pin commit")
        if verdict.kind == "superseded":
            failure = outcome.superseded(verdict, pr)
            await self._finish(Stage.CANCELLED, "cancelled", failure)
            raise ApplicationError(f"{failure.message} — next step: {failure.next_step}", self._report,
                                   type="BuildFailed", non_retryable=True)
        if verdict.kind == "rebased" and verdict.pin_commit:
            pr.pin_commit = pr.head_sha = verdict.pin_commit
            self._merge_auth, self._conflict = None, None
            rep.message = verdict.detail
            return True
        return False

    def _pr_body(self) -> bool:
        src = self._report.source
        return src is not None and src.digests_in == "pr_body"

    def _pin(self) -> str | None:
        """The commit the service pushed to the build branch (its pin commit): the only head it merges."""
        pr = self._report.pull_request
        return (pr.pin_commit or pr.head_sha) if pr else None

    async def _closed_outside(self, pr: PullRequestInfo) -> None:
        """Someone closed the PR unmerged or deleted the build branch: nothing is left to wait for. The build
        ends cancelled, naming who and when and how to take it up again; the run fails (so ``resume`` may
        start it again), with the report as the failure's details like every other end."""
        pr.state = "closed"
        failure = outcome.closed_outside(self._review, pr, workflow.info().workflow_id)
        await self._finish(Stage.CANCELLED, "cancelled", failure)
        raise ApplicationError(f"{failure.message} — next step: {failure.next_step}", self._report,
                               type="BuildFailed", non_retryable=True)

    def _show_drift(self) -> None:
        """BuildFailureClass says what holds the merge while someone else's registry change does
        (``tag_moved``, ``visibility``); cleared once the registry serves the validated images again."""
        cls = outcome.drift_class(self._review.registry_drift if self._review else [])
        if cls != self._drift_class:
            self._drift_class = cls
            workflow.upsert_search_attributes([sa.FAILURE_CLASS.value_set(sa.keyword(cls)) if cls
                                               else sa.FAILURE_CLASS.value_unset()])

    @staticmethod
    def _history_is_long(inp: PipelineInput) -> bool:
        info = workflow.info()
        return info.is_continue_as_new_suggested() or info.get_current_history_length() >= inp.merge_wait_events_per_run

    def _merge_wait_state(self, inp: PipelineInput) -> MergeWaitState:
        return MergeWaitState(
            report=self._report, merge_auth=self._merge_auth, targets=list(self._targets.values()),
            merge_wait_since=self._merge_wait_since.isoformat() if self._merge_wait_since else None,
            runs=(inp.resume.runs if inp.resume else 1) + 1)

    def _resume(self, state: MergeWaitState) -> PullRequestInfo:
        """Take over the merge wait of the run this one continues (report, review, authorization)."""
        self._report = rep = state.report
        self._review = rep.review
        self._merge_auth = state.merge_auth
        self._targets = {b.key: b for b in state.targets}
        self._merge_wait_since = datetime.fromisoformat(state.merge_wait_since) if state.merge_wait_since else None
        self._stage = Stage.AWAITING_MERGE
        self._step = Stage.AWAITING_MERGE.value
        self._show_merge_wait()
        assert rep.pull_request is not None, "a merge wait always has its PR"
        return rep.pull_request

    def _show_merge_wait(self) -> None:
        """While awaiting merge: say whether CI, a reviewer or an operator's authorization is awaited."""
        rev, pr, wid = self._review, self._report.pull_request, workflow.info().workflow_id
        auth = self._report.merge_authorization = self._merge_auth
        if rev is None or pr is None or rev.merged:
            self._report.waiting = []
            self._refresh()
            return
        optional = f" (optional, not blocking: {', '.join(rev.optional_failing)})" if rev.optional_failing else ""
        source = f"; required checks from {rev.required_source}" if rev.required_source else ""
        drift = [outcome.drift_waiting(rev.registry_drift, pr, wid)] if rev.registry_drift else []
        if rev.foreign_head is not None:  # held whatever the checks say: the head is not the pin commit
            self._report.waiting = [outcome.head_moved_waiting(rev.foreign_head, pr, wid)] + drift
            self._refresh()
            return
        if rev.mergeable is False:  # GitHub cannot merge it: why, and the next step
            self._report.waiting = [outcome.conflict_waiting(self._conflict, rev, pr, wid, self._request)] + drift
            self._refresh()
            return
        if auth is not None:
            blocking = _blocking(rev, auth.override_checks)
            over = f"; overridden: {', '.join(auth.override_checks)}" if auth.override_checks else ""
            self._report.waiting = [WaitingReason(
                kind="merge_checks", detail=f"merge of PR #{pr.number} authorized by {auth.by}"
                + (f" ({auth.verified})" if auth.verified else "")
                + (f"; waiting for {blocking}" if blocking else f"; merging at {rev.head_sha[:12]}")
                + over + optional + source)] + drift
        elif blocking := _blocking(rev):
            then = ("approve-merge is accepted now and merges once they are green" if self._gate else
                    "approve-merge is refused until checks are green and no changes are requested")
            self._report.waiting = [WaitingReason(
                kind="merge_checks", detail=f"PR #{pr.number} ({pr.url}): {blocking}{optional}; {then}{source}")] + drift
        else:
            self._report.waiting = [WaitingReason(
                kind="merge_authorization", detail=f"PR #{pr.number} ({pr.url}) is green{optional}: an operator "
                                                   f"authorizes the merge{source}",
                command=outcome.approve_command(wid))]
        self._refresh()

    async def _run_target(self, inp: PipelineInput, source: SourceSnapshot, target) -> TargetResult:
        child_id = target_workflow_id(workflow.info().workflow_id, target.key)
        if workflow.patched(patches.ADOPT_VALIDATED):
            # Resume, don't rebuild: a target an earlier run of this build commit validated (image still at
            # its tag, evidence in the store) is adopted; only the others get a child and an Iris job.
            adopted = await workflow.execute_activity_method(
                BuildActivities.adopt_validated,
                AdoptInput(request_id=inp.request_id, target=target, build_commit=source.build_commit,
                           harbor_commit=source.harbor_commit),
                **options.ADOPT, summary=f"adopt {target.key} if an earlier run already validated it")
            if adopted.result is not None:
                r = adopted.result
                self._targets[target.key] = TargetBrief(key=target.key, stage=Stage.DONE,
                                                        job_id=r.job_ids[-1] if r.job_ids else None)
                self._refresh()
                return r
        try:
            return await workflow.execute_child_workflow(
                TargetBuildWorkflow.run,
                TargetInput(request_id=inp.request_id, target=target, build_commit=source.build_commit,
                            harbor_commit=source.harbor_commit, branch=source.branch),
                id=child_id, parent_close_policy=ParentClosePolicy.REQUEST_CANCEL,
                search_attributes=workflow.info().typed_search_attributes.updated(
                    sa.ARCHITECTURE.value_set(sa.keyword(target.architecture)),
                    sa.VARIANT.value_set(sa.keyword(target.variant))),
                static_summary=f"{target.key} → {target.image_repository}:{target.tag} on {target.cluster}",
            )
        except ChildWorkflowError as e:
            cause = e.cause
            if isinstance(cause, ApplicationError) and cause.details:
                detail = cause.details[0]
                return detail if isinstance(detail, TargetResult) else TargetResult.model_validate(detail)
            return TargetResult(key=target.key, architecture=target.architecture, variant=target.variant,
                                status="failed", cluster=target.cluster, job_ids=[], tag=target.tag,
                                image_ref=f"{target.image_repository}:{target.tag}",
                                message=f"{target.key}: child workflow failed: {cause or e}")

    async def _set_stage(self, stage: Stage) -> None:
        old = self._stage
        self._stage = stage
        self._step = stage.value
        if stage == Stage.RUNNING and self._target_waits():
            stage = self._stage = Stage.WAITING
        if stage != old:
            self._observe(old, stage)
        workflow.upsert_search_attributes([sa.STAGE.value_set(stage.value)])
        self._refresh()

    def _observe(self, old: Stage, new: Stage) -> None:
        """One log line and the domain metrics per real stage change; the merge wait is operator time."""
        now = workflow.now()
        if old == Stage.AWAITING_MERGE and self._merge_wait_since is not None:
            metrics.operator_wait("pipeline", "merge", (now - self._merge_wait_since).total_seconds())
            self._merge_wait_since = None
        if new == Stage.AWAITING_MERGE and self._merge_wait_since is None:
            self._merge_wait_since = now
        metrics.stage_entered("pipeline", new.value)
        workflow.logger.info("pipeline: %s -> %s", old.value, new.value)

    def _refresh(self) -> None:
        """Memo and UI details follow every change, so a closed build still says how it ended."""
        rep = self._report
        if self._stage in (Stage.RUNNING, Stage.WAITING):
            rep.waiting = self._target_waits()
        memo = self._memo()
        if memo != self._memo_sent:  # one memo event per real change, not per signal
            workflow.upsert_memo({"summary": memo})
            self._memo_sent = memo
        src = rep.source.build_commit[:12] if rep.source else "?"
        targets = [self._targets.get(t.key) or TargetBrief(key=t.key, stage=Stage.QUEUED) for t in rep.plan]
        note = f"{rep.status}; source `{src}`"
        digests = {r.key: r.digest for r in rep.targets or [] if r.digest}
        workflow.set_current_details(outcome.details_markdown(
            title="GPU-RL build", stage=self._stage, targets=targets, waiting=rep.waiting,
            failure=rep.failure, note=note, digests=digests, pull_request=rep.pull_request))

    def _memo(self) -> str:
        rep = self._report
        src = rep.source.build_commit[:12] if rep.source else "?"
        parts = [f"source {src}", f"stage {self._stage.value}", f"status {rep.status}"]
        if rep.failure:
            parts.append(f"{rep.failure.failure_class}: {rep.failure.message[:300]}; next step: "
                         f"{rep.failure.next_step[:300]}")
        for r in rep.targets or []:
            parts.append(f"{r.key}: {r.status} {r.digest or ''}".strip())
        if not rep.targets:
            parts.extend(f"{t.key}: planned {t.tag}" for t in rep.plan)
        return "; ".join(parts)


def _blocking(rev: ReviewState, overrides: list[str] | tuple[str, ...] = ()) -> str:
    """What keeps an authorized merge from happening now ("" = nothing): required checks not green (less
    the operator's overrides) and reviewers with write access requesting changes."""
    over = set(overrides)
    failing = [c for c in rev.failing_checks if c not in over]
    pending = [c for c in rev.pending_checks if c not in over]
    parts = []
    if failing:
        parts.append(f"required checks failing: {', '.join(failing)}")
    if pending:
        parts.append(f"required checks pending: {', '.join(pending)}")
    if rev.checks != "success" and not failing and not pending and not (
            over & (set(rev.failing_checks) | set(rev.pending_checks))):
        parts.append(f"required checks {rev.checks}" + (" (none reported yet)" if rev.checks == "pending" else ""))
    if rev.changes_requested:
        parts.append(f"changes requested by {', '.join(rev.blocking_reviewers) or 'a reviewer'}")
    if rev.registry_drift:  # someone else's tag move or visibility change: no override merges over it
        parts.append(outcome.drift_blocking(rev.registry_drift))
    if rev.foreign_head is not None:  # someone else's head on the build branch: never merged
        parts.append(outcome.head_moved_blocking(rev.foreign_head))
    return "; ".join(parts)


def _settle_quietly(task: asyncio.Future) -> None:
    """A cancelled watch ends with an "Activity cancelled" error nobody needs; reading it when it
    arrives keeps asyncio from logging "Task exception was never retrieved" on every normal merge."""
    task.add_done_callback(lambda t: t.cancelled() or t.exception())


__all__ = ["BuildPipelineWorkflow", "TargetStatus"]


def _error_of(e: BaseException) -> tuple[str, str]:
    """The root error's type and message: an activity's ApplicationError type, or a timeout kind."""
    cause = e
    while isinstance(cause, (ActivityError, ChildWorkflowError)) and cause.cause is not None:
        cause = cause.cause
    if isinstance(cause, ApplicationError):
        return cause.type or "ApplicationError", cause.message
    if isinstance(cause, TemporalTimeoutError):
        return "ActivityTimeout", f"{cause.type.name.lower() if cause.type else 'timeout'}: {cause.message}"
    return type(cause).__name__, getattr(cause, "message", None) or str(cause)
