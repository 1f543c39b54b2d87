"""One child workflow per (architecture, variant): submit, monitor, judge, retry by policy, validate.

Why a child workflow: each target has its own job, failure history, operator decisions and UI row
(filterable by BuildArchitecture/BuildVariant/BuildStage/BuildFailureClass); the parent only fans
out and collects. All I/O is in activities; this file only decides.
"""

from __future__ import annotations

import asyncio
from datetime import datetime, timedelta

from temporalio import workflow
from temporalio.exceptions import ActivityError, ApplicationError, is_cancelled_exception
from temporalio.exceptions import TimeoutError as TemporalTimeoutError

with workflow.unsafe.imports_passed_through():
    from activities.build import BuildActivities
    from activities.watch import WatchActivities
    from domain.failures import decide_retry
    from domain.jobs import generation_of, registry_has_our_image, vanished_job_classification
    from domain.models import (
        AuthorizeInput,
        CaptureInput,
        FailureRecord,
        FileRef,
        JobProgress,
        LogCheck,
        LogCheckInput,
        MonitorInput,
        OperatorDecision,
        Stage,
        SubmitInput,
        TargetBrief,
        TargetInput,
        TargetResult,
        TargetResume,
        TargetStatus,
        TerminateInput,
        ValidateInput,
        WaitingReason,
    )
    from domain.outcome import decide_command, details_markdown, q, recheck_command, target_step_failure
    from domain.validation import ValidationReport
    from domain.watch import WatchJobInput
    from runtime import search_attributes as sa
    from workflows import metrics, options, patches
    from workflows.operators import verify_operator

MAX_ROUNDS = 10  # hard stop on resubmissions, whatever the per-class budgets say
SAFETY_BACKOFF_MAX = 3  # a watched job unchanged for long is re-checked at most every 3 safety intervals
# A decision wait wakes at least this often (a timer, a few events a day) to see whether to continue as new.
WAIT_SLICE_S = 24 * 3600
# A long wait continues as new after this long in one run even if its history is short: the next run
# starts on the newest code, so fewer patches must be carried (docs/versioning.md, rule 7).
WAIT_RUN_MAX_S = 7 * 24 * 3600


@workflow.defn
class TargetBuildWorkflow:
    @workflow.init
    def __init__(self, inp: TargetInput) -> None:
        self._inp = inp
        self._status = TargetStatus(key=inp.target.key, stage=Stage.QUEUED)
        self._decision: OperatorDecision | None = None
        self._awaiting_decision = False
        self._recheck = False
        self._classification = None
        self._claimed_digest: str | None = None  # the digest the build log says was pushed
        self._evidence: dict[str, str] = {}
        self._waiting_since: datetime | None = None
        self._waiting_reason = "decision"
        self._watched_job: str | None = None
        self._wake: JobProgress | None = None
        self._sent: TargetBrief | None = None  # the brief the pipeline was last told
        self._telling: asyncio.Task | None = None  # a brief on its way to the pipeline (``_set_stage(wait=False)``)
        self._sent_attributes: list[str | None] | None = None  # [stage, failure class] last upserted
        self._round, self._used, self._result = 0, {}, None  # what a continued wait carries
        self._decision_deadline: datetime | None = None
        self._validation_started: datetime | None = None

    # ------------------------------------------------------------------ operator surface
    @workflow.query
    def status(self) -> TargetStatus:
        return self._status

    @workflow.update
    async def decide(self, decision: OperatorDecision) -> str:
        """The operator's answer, once the worker verified the caller is a configured operator."""
        who = ""
        if workflow.patched(patches.OPERATOR_AUTHORIZATION):
            verified = await verify_operator(AuthorizeInput(
                kind="decide", by=decision.by, request_id=self._inp.request_id,
                detail=f"{self._inp.target.key} {decision.action}"))
            decision = decision.model_copy(update={"verified": verified.verified,
                                                   "temporal_identity": verified.temporal_identity})
            who = f" (by {decision.by}, {verified.verified}" + (
                f"; Temporal identity {verified.temporal_identity}" if verified.temporal_identity else "") + ")"
        self._decision = decision
        return f"{decision.action} accepted for {self._inp.target.key}{who}"

    @decide.validator
    def _validate_decide(self, decision: OperatorDecision) -> None:
        if not self._awaiting_decision:
            raise ValueError(f"{self._inp.target.key} is not waiting for an operator decision")

    @workflow.signal
    def recheck(self) -> None:
        """Re-run validation now (e.g. after the package was made public)."""
        self._recheck = True

    @workflow.signal
    def job_changed(self, progress: JobProgress) -> None:
        """The cluster watcher saw our job change (progress worth a history event; a state change from a
        watcher of the previous release, or when the ``wake`` update could not be delivered)."""
        self._take_wake(progress)

    @workflow.update
    def wake(self, progress: JobProgress) -> None:
        """The cluster watcher saw our job's state change (an end above all): the same as ``job_changed``, as
        an update. Why: the server runs an update's workflow task speculatively and persists it once, with the
        commands it returns (here: the log check), where a signal costs a persisted signal event and task, a
        persisted task start, then the completion. With 50 targets woken at once on the dev server, signal →
        log check scheduled was p95 4.1 / 7.7 s as signals and 2.1 / 1.2 s as updates (load 9-12, interleaved;
        issue 37). Idempotent like the signal: a repeated or late wake-up changes nothing."""
        self._take_wake(progress)

    def _take_wake(self, progress: JobProgress) -> None:
        if progress.job_id != self._watched_job:
            return  # about an earlier job of this target: stale
        if self._wake is not None and self._wake.terminal and not progress.terminal:
            return  # never let a late non-terminal observation hide a terminal one
        self._wake = progress

    # ------------------------------------------------------------------ the run
    @workflow.run
    async def run(self, inp: TargetInput) -> TargetResult:
        try:
            return await self._build(inp)
        except BaseException as e:
            # Cancelled by an operator (it surfaces as CancelledError, or as an activity error caused by
            # one): stop our own jobs (exact ids, never a prefix), nothing else on the cluster.
            if not (isinstance(e, asyncio.CancelledError) or is_cancelled_exception(e)):
                if isinstance(e, ActivityError) and workflow.patched(patches.TARGET_STEP_FAILURE):
                    raise await self._step_failed(inp, e) from e  # the step's error stays the cause
                raise
            if self._status.job_ids:
                await workflow.execute_activity_method(
                    BuildActivities.terminate_jobs,
                    TerminateInput(cluster=inp.target.cluster, job_ids=list(self._status.job_ids)),
                    **options.TERMINATE,
                    summary=f"terminate {', '.join(self._status.job_ids)} (pipeline cancelled)")
            self._status.waiting = None
            self._status.message = (f"{inp.target.key}: cancelled; terminated "
                                    f"{', '.join(self._status.job_ids) or 'no job (none submitted)'}")
            await self._set_stage(Stage.CANCELLED, failure_class="cancelled")
            raise

    async def _step_failed(self, inp: TargetInput, e: ActivityError) -> ApplicationError:
        """A step failed for good: fail the target with its job ids and the step's own error as the cause."""
        cause: BaseException = e
        while isinstance(cause, ActivityError) and cause.cause is not None:
            cause = cause.cause
        if isinstance(cause, ApplicationError):
            error_type, message = cause.type or "ApplicationError", cause.message
        elif isinstance(cause, TemporalTimeoutError):
            error_type, message = "ActivityTimeout", f"{cause.type.name.lower() if cause.type else 'timeout'}"
        else:
            error_type, message = type(cause).__name__, str(cause)
        t = inp.target
        result = self._result or TargetResult(
            key=t.key, architecture=t.architecture, variant=t.variant, status="failed", cluster=t.cluster,
            job_ids=[], tag=t.tag, image_ref=f"{t.image_repository}:{t.tag}")
        failure = target_step_failure(t.key, e.activity_type or "activity", error_type, message,
                                      list(self._status.job_ids))
        result.status = "failed"
        result.job_ids = list(self._status.job_ids)
        result.failures.append(failure)
        result.message = self._status.message = _failure_message(t.key, failure, inp.request_id)
        self._status.failure_class = failure.failure_class
        await self._set_stage(Stage.FAILED, failure_class=failure.failure_class)
        return ApplicationError(result.message, result, type="TargetFailed", non_retryable=True)

    async def _build(self, inp: TargetInput) -> TargetResult:
        t = inp.target
        r = inp.resume
        if r is not None:
            result, used, start = self._restore(r)
        else:
            result = TargetResult(key=t.key, architecture=t.architecture, variant=t.variant, status="failed",
                                  cluster=t.cluster, job_ids=[], tag=t.tag,
                                  image_ref=f"{t.image_repository}:{t.tag}")
            used, start = {}, 0
        self._result, self._used = result, used
        policy = await self._policy()
        if r is None or r.phase == "decision":
            for round_ in range(start, MAX_ROUNDS):
                self._round = round_
                if r is not None and round_ == start:  # continued while waiting for this round's decision
                    failure = result.failures[-1]
                    failure.decision = await self._ask_operator(failure, policy, resumed=r)
                else:
                    failure = await self._attempt(round_, result, used, policy)
                    if failure is None:
                        break
                if failure.decision == "retry":
                    used[failure.failure_class] = used.get(failure.failure_class, 0) + 1
                    continue
                result.status = "aborted" if failure.decision == "abort" else "failed"
                result.message = self._status.message = _failure_message(t.key, failure, inp.request_id)
                await self._set_stage(Stage.FAILED, failure_class=failure.failure_class)
                raise ApplicationError(result.message, result, type="TargetFailed", non_retryable=True)
            else:
                result.message = self._status.message = f"{t.key}: gave up after {MAX_ROUNDS} submissions"
                await self._set_stage(Stage.FAILED, failure_class=self._status.failure_class or "unknown")
                raise ApplicationError(result.message, result, type="TargetFailed", non_retryable=True)

        report = await self._validate_until_settled(policy, resumed=r is not None and r.phase == "validation")
        result.validation = report
        result.digest = report.digest
        result.platform = report.platform
        if not report.ok:
            result.message = f"{t.key}: validation failed: {report.failure_summary()}"
            result.message = self._status.message = (
                f"{result.message}; next step: fix the image (platform, layers, labels) and build again")
            await self._set_stage(Stage.FAILED, failure_class="validation")
            raise ApplicationError(result.message, result, type="TargetFailed", non_retryable=True)
        result.status = "validated"
        note = f" ({result.message})" if result.message else ""
        result.message = self._status.message = f"{t.key}: {result.image_ref}@{report.digest} validated{note}"
        self._status.validation_ok = True
        await self._set_stage(Stage.DONE)
        return result

    async def _attempt(self, round_: int, result: TargetResult, used: dict[str, int], policy) -> FailureRecord | None:
        """One submission: None when it built the image, else its failure with the decision taken on it."""
        t = self._inp.target
        job_id = await self._submit(round_)
        result.job_ids.append(job_id)
        progress = await self._monitor(job_id, policy)
        failure: FailureRecord | None = None
        if progress.state == "succeeded":
            check = await self._check_log(job_id)
            result.log_check = check
            if not check.missing and check.final_push_seen and not check.contradicted:
                if check.stood_in:  # a result text only (no command): replays as before
                    result.message = (f"the build log of {job_id} was incomplete ({'; '.join(check.incomplete)}); "
                                      f"the image stood in for {len(check.stood_in)} marker(s): "
                                      + "; ".join(f"{k} <- {v}" for k, v in list(check.stood_in.items())[:3])
                                      + (" ..." if len(check.stood_in) > 3 else ""))
                return None
            failure = await self._capture(job_id, check)
        elif progress.missing or progress.state == "missing":
            # The controller forgot the job (pruned row, no pod): never success on absence alone.
            # The registry decides: our tag with our labels and a complete log → recovered.
            check = await self._recovered(job_id)
            if check is not None:
                result.log_check = check
                result.message = f"{t.key}: {job_id} vanished from the controller; recovered from the registry"
                return None
            failure = await self._capture(job_id, None)
            self._classification = vanished_job_classification(job_id)
            failure.failure_class = str(self._classification.failure_class)
            failure.reasons = self._classification.reasons
            failure.hint = self._classification.operator_hint
            self._status.failure_class = failure.failure_class
        else:
            failure = await self._capture(job_id, None)
        failure.decision = decide_retry(self._classification, used, policy.retry_budget)
        result.failures.append(failure)
        await self._set_stage(Stage.CAPTURING, failure_class=failure.failure_class)
        if failure.decision == "ask_operator":
            failure.decision = await self._ask_operator(failure, policy)
        return failure

    # ------------------------------------------------------------------ long waits: continue as new
    def _restore(self, r: TargetResume) -> tuple[TargetResult, dict[str, int], int]:
        """Take over the wait of the run this one continues."""
        self._status = r.status
        self._evidence = dict(r.evidence)
        self._waiting_since = datetime.fromisoformat(r.waiting_since) if r.waiting_since else None
        self._waiting_reason = r.waiting_reason
        self._recheck = r.recheck
        self._validation_started = (datetime.fromisoformat(r.validation_started) if r.validation_started
                                    else None)
        self._sent, self._sent_attributes = r.sent, r.sent_attributes
        workflow.set_current_details(self._details())
        return r.result, dict(r.used), r.round

    def _wait_is_long(self) -> bool:
        info = workflow.info()
        return (info.is_continue_as_new_suggested() or info.get_current_history_length() >= self._inp.wait_events_per_run
                or (workflow.now() - info.start_time).total_seconds() >= WAIT_RUN_MAX_S)

    async def _continue_as_new(self, phase: str) -> None:
        """End this run and carry the wait into a new one (the parent follows the chain)."""
        await self._flush_pipeline()
        await workflow.wait_condition(workflow.all_handlers_finished)
        r = self._inp.resume
        state = TargetResume(
            phase=phase, round=self._round, used=dict(self._used), result=self._result, status=self._status,
            evidence=dict(self._evidence),
            waiting_since=self._waiting_since.isoformat() if self._waiting_since else None,
            waiting_reason=self._waiting_reason,
            decision_deadline=self._decision_deadline.isoformat() if self._decision_deadline else None,
            decision=self._decision, recheck=self._recheck,
            validation_started=self._validation_started.isoformat() if self._validation_started else None,
            sent=self._sent, sent_attributes=self._sent_attributes, runs=(r.runs if r else 1) + 1,
        ).model_copy(deep=True)  # serialized after this stack unwinds: later edits must not reach it
        workflow.continue_as_new(self._inp.model_copy(update={"resume": state}))

    # ------------------------------------------------------------------ steps
    async def _policy(self):
        return await workflow.execute_activity_method(
            BuildActivities.policy, **options.POLICY,
            summary="read the retry policy from the service configuration")

    async def _submit(self, round_: int) -> str:
        await self._set_stage(Stage.SUBMITTING)
        inp = self._inp
        job = await workflow.execute_activity_method(
            BuildActivities.submit_job,
            SubmitInput(request_id=inp.request_id, target=inp.target, build_commit=inp.build_commit,
                        branch=inp.branch, round=round_,
                        generation=generation_of(workflow.info().first_execution_run_id)),
            **options.SUBMIT,
            summary=f"submit the Iris job for {inp.target.key} (round {round_})")
        self._status.job_ids.append(job.job_id)
        return job.job_id

    async def _monitor(self, job_id: str, policy) -> JobProgress:
        if workflow.patched(patches.CLUSTER_WATCHER):
            return await self._monitor_watched(job_id, policy)
        return await self._monitor_polling(job_id, policy)

    async def _monitor_watched(self, job_id: str, policy) -> JobProgress:
        """Register with the cluster's watcher and sleep until it wakes us: history grows with changes of
        the job, not with time. The safety timer re-checks the watch when nothing arrived for a while (a
        lost wake-up or a dead watcher is noticed; a healthy watcher answers it without asking Iris). While
        re-checks find nothing new (a job queued for days) the timer backs off to SAFETY_BACKOFF_MAX times
        the interval, so even a 30-day queue stays under Temporal's 10,240-event warning."""
        await self._set_stage(Stage.RUNNING)
        self._watched_job, self._wake = job_id, None
        progress = await self._watch(job_id, None)
        quiet = 0  # safety re-checks in a row that found the job as we knew it
        while True:
            self._status.progress = progress
            self._status.updated_at = workflow.now().isoformat()
            if progress.terminal:
                self._watched_job = None
                return progress
            safety = policy.monitor_safety_interval_s * min(1 + quiet, SAFETY_BACKOFF_MAX)
            try:
                await workflow.wait_condition(lambda: self._wake is not None, timeout=timedelta(seconds=safety))
                progress, self._wake, quiet = self._wake, None, 0
            except TimeoutError:
                known = progress
                progress = await self._watch(job_id, known)
                quiet = quiet + 1 if (progress.state, progress.terminal) == (known.state, known.terminal) else 0

    async def _watch(self, job_id: str, known: JobProgress | None) -> JobProgress:
        t = self._inp.target
        return await workflow.execute_activity_method(
            WatchActivities.watch_job,
            WatchJobInput(cluster=t.cluster, job_id=job_id, workflow_id=workflow.info().workflow_id,
                          markers=[m.text for m in t.expected_markers if m.text], known=known,
                          registered_at=workflow.now().isoformat()),
            **options.WATCH_JOB,
            summary=f"{'re-check the watch of' if known else 'watch'} {job_id} (the cluster watcher wakes this "
                    "target on change)")

    async def _monitor_polling(self, job_id: str, policy) -> JobProgress:
        """Before the watcher: one monitor_job activity per progress interval (kept for running builds)."""
        await self._set_stage(Stage.RUNNING)
        cursor, marker = 0, None
        while True:
            progress: JobProgress = await workflow.execute_activity_method(
                BuildActivities.monitor_job,
                MonitorInput(job_id=job_id, cluster=self._inp.target.cluster,
                             return_after_s=policy.progress_interval_s, log_cursor=cursor, last_marker=marker,
                             markers=[m.text for m in self._inp.target.expected_markers if m.text]),
                **options.monitor_job(policy.progress_interval_s),
                summary=f"poll Iris for {job_id}")
            cursor, marker = progress.log_cursor, progress.last_marker
            self._status.progress = progress
            self._status.updated_at = workflow.now().isoformat()
            if progress.terminal:
                return progress
            # History stays bounded: one short activity per progress interval (~6 events a minute),
            # about 3,500 events for the longest (8 h) build, well under Temporal's 10k warning.

    async def _check_log(self, job_id: str) -> LogCheck:
        await self._set_stage(Stage.VALIDATING, wait=False)  # the end is acted on at once
        check = await workflow.execute_activity_method(
            BuildActivities.check_build_log,
            LogCheckInput(request_id=self._inp.request_id, job_id=job_id, cluster=self._inp.target.cluster,
                          target=self._inp.target, build_commit=self._inp.build_commit,
                          harbor_commit=self._inp.harbor_commit),
            **options.CHECK_LOG, summary=f"fetch the full log of {job_id} and check the assertion markers")
        self._publish_evidence(f"{job_id} build log", check.log)
        # What this job pushed: its log's `Pushed` digest, else the one the image judgement relied on.
        self._claimed_digest = check.pushed_digest or check.image_digest
        return check

    async def _capture(self, job_id: str, check: LogCheck | None) -> FailureRecord:
        await self._set_stage(Stage.CAPTURING, wait=False)  # the end is acted on at once
        captured = await workflow.execute_activity_method(
            BuildActivities.capture_failure,
            CaptureInput(request_id=self._inp.request_id, job_id=job_id, cluster=self._inp.target.cluster,
                         target_key=self._inp.target.key, missing_markers=list(check.missing) if check else [],
                         log_lost=list(check.lost) if check else [],
                         log_lost_cause=check.lost_cause if check else "log",
                         contradicted=list(check.contradicted) if check else []),
            **options.CAPTURE, summary=f"capture summary, logs, pod reason and events for {job_id}")
        c = self._classification = captured.classification
        self._status.failure_class = str(c.failure_class)
        self._publish_evidence(f"{job_id} diagnostics", captured.diagnostics)
        return FailureRecord(job_id=job_id, failure_class=str(c.failure_class), reasons=c.reasons,
                             decision="fail", diagnostics=captured.diagnostics, log=captured.log,
                             failing_line=captured.failing_line, hint=c.operator_hint)

    async def _ask_operator(self, failure: FailureRecord, policy, resumed: TargetResume | None = None) -> str:
        self._awaiting_decision = True
        key = self._inp.target.key
        if resumed is None:
            self._decision = None
            self._status.waiting = WaitingReason(
                kind="operator_decision", target=key,
                detail=(f"operator decision on the {failure.failure_class} failure of {failure.job_id} "
                        + (f"— {failure.reasons[0]} " if failure.reasons else "")  # Iris's own reason
                        + f"(evidence {failure.diagnostics.uri if failure.diagnostics else '-'}); "
                        f"to give up instead run `{decide_command(self._inp.request_id, key, 'abort')}`"),
                command=decide_command(self._inp.request_id, key, "retry"))
            await self._set_stage(Stage.WAITING)
            self._decision_deadline = workflow.now() + timedelta(seconds=policy.operator_decision_timeout_s)
        else:
            self._decision = resumed.decision
            self._decision_deadline = datetime.fromisoformat(resumed.decision_deadline or workflow.now().isoformat())
        try:
            if resumed is None and not workflow.patched(patches.BOUNDED_WAITS):
                try:  # runs started before: one timer for the whole wait
                    await workflow.wait_condition(lambda: self._decision is not None,
                                                  timeout=timedelta(seconds=policy.operator_decision_timeout_s))
                except TimeoutError:
                    return "fail"
                return self._decision.action
            # Days-long: wake at least daily; continue as new once this run's history or age is long.
            while self._decision is None:
                remaining = (self._decision_deadline - workflow.now()).total_seconds()
                if remaining <= 0:
                    return "fail"
                try:
                    await workflow.wait_condition(lambda: self._decision is not None,
                                                  timeout=timedelta(seconds=min(remaining, WAIT_SLICE_S)))
                except TimeoutError:
                    if remaining > WAIT_SLICE_S and self._wait_is_long():
                        await self._continue_as_new("decision")
        finally:
            self._awaiting_decision = False
            self._status.waiting = None
        return self._decision.action

    async def _recovered(self, job_id: str) -> LogCheck | None:
        """A vanished job's image counts only if the registry has our tag with our revision labels and
        the log (when the log store still has it) shows every marker and the final push."""
        if not registry_has_our_image(await self._validate()):
            return None
        check = await self._check_log(job_id)
        return check if not check.missing and check.final_push_seen and not check.contradicted else None

    async def _validate(self) -> ValidationReport:
        inp = self._inp
        return await workflow.execute_activity_method(
            BuildActivities.validate_image,
            ValidateInput(target=inp.target, build_commit=inp.build_commit, harbor_commit=inp.harbor_commit,
                          claimed_digest=self._claimed_digest),
            **options.VALIDATE,
            summary=f"validate {inp.target.image_repository}:{inp.target.tag}")

    async def _validate_until_settled(self, policy, resumed: bool = False) -> ValidationReport:
        bounded = workflow.patched(patches.BOUNDED_WAITS)
        if not resumed:
            await self._set_stage(Stage.VALIDATING)
        settle = workflow.patched(patches.VALIDATION_SETTLE)
        if self._validation_started is None:
            self._validation_started = workflow.now()
        started, delay = self._validation_started, policy.validation_retry_initial_s
        key = self._inp.target.key
        while True:
            self._recheck = False  # before validating: a recheck sent during validation is not lost
            report = await self._validate()
            if settle and report.awaiting_registry:
                # The registry could not answer (5xx/429/network): a verdict on nothing. Ask again, bounded.
                waited = (workflow.now() - started).total_seconds()
                if waited + delay <= policy.validation_inconclusive_budget_s:
                    await self._wait_for_registry(report, delay, waited, policy)
                    delay = min(delay * 2, policy.validation_retry_max_s)
                    continue
                if not bounded:
                    return report
                # Past the budget the registry is down, not the image: wait for it (never a rebuild).
                minutes = policy.validation_inconclusive_budget_s / 60
                await self._long_wait(WaitingReason(
                    kind="registry_unreachable", target=key,
                    detail=(f"the registry did not answer for {minutes:.0f} min (config:policy."
                            f"validation_inconclusive_budget_s); re-check with "
                            f"`{recheck_command(self._inp.request_id, key)}` once it answers (it is also "
                            f"validated again every {policy.visibility_recheck_interval_s} s); the image is "
                            "built and is not rebuilt"),
                    command=recheck_command(self._inp.request_id, key)), "validation_inconclusive", policy)
                continue
            if not report.blocked_on_visibility:
                self._status.waiting = None
                return report
            # Green build, private package: never rebuild, wait for the operator to flip visibility.
            waiting = WaitingReason(
                kind="package_visibility", target=key,
                detail=(f"{self._inp.target.image_repository} is not anonymously pullable: make the package public "
                        "(GitHub → Packages → Package settings → Change visibility → Public), then re-check"),
                command=recheck_command(self._inp.request_id, key))
            if bounded:
                await self._long_wait(waiting, "visibility", policy)
                continue
            self._status.waiting = waiting
            await self._set_stage(Stage.WAITING, failure_class="visibility")
            try:
                await workflow.wait_condition(lambda: self._recheck,
                                              timeout=timedelta(seconds=policy.visibility_recheck_interval_s))
            except TimeoutError:
                pass
            self._status.waiting = None
            await self._set_stage(Stage.VALIDATING)

    async def _long_wait(self, waiting: WaitingReason, failure_class: str, policy) -> None:
        """Wait for a re-check (or the re-check interval) while staying WAITING: validating again adds no
        stage change, so the pipeline is told only when the wait itself changes (at most once per re-check),
        and the run continues as new once its history or age is long (bounded whatever the wait's length)."""
        self._status.waiting = waiting
        await self._set_stage(Stage.WAITING, failure_class=failure_class)
        try:
            await workflow.wait_condition(lambda: self._recheck,
                                          timeout=timedelta(seconds=policy.visibility_recheck_interval_s))
        except TimeoutError:
            pass
        if self._wait_is_long():
            await self._continue_as_new("validation")

    async def _wait_for_registry(self, report: ValidationReport, delay: float, waited: float, policy) -> None:
        key = self._inp.target.key
        checks = ", ".join(f"{c.name} ({c.observed})" for c in report.checks if c.verdict == "inconclusive")
        self._status.waiting = WaitingReason(
            kind="registry_inconclusive", target=key,
            detail=(f"the registry gave no verdict on {checks}; validating again in {delay:.0f}s "
                    f"({waited:.0f}s of {policy.validation_inconclusive_budget_s}s allowed, "
                    "config:policy.validation_inconclusive_budget_s)"),
            command=recheck_command(self._inp.request_id, key))
        await self._set_stage(Stage.WAITING, failure_class="validation_inconclusive")
        try:
            await workflow.wait_condition(lambda: self._recheck, timeout=timedelta(seconds=delay))
        except TimeoutError:
            pass
        self._status.waiting = None
        await self._set_stage(Stage.VALIDATING)

    def _publish_evidence(self, what: str, ref: FileRef) -> None:
        """Show the evidence file (store URI + sha256) in the memo, i.e. in the UI's row for this target.

        A memo upsert is a command: runs started before this code recorded none, so it is patched
        (docs/versioning.md) and such runs, replayed here, skip it until they finish."""
        self._evidence[what] = f"{ref.uri} (sha256 {ref.sha256})"
        if workflow.patched(patches.EVIDENCE_MEMO):
            workflow.upsert_memo({"evidence": dict(self._evidence)})

    async def _set_stage(self, stage: Stage, *, failure_class: str | None = None, wait: bool = True) -> None:
        """Record a stage everywhere operators look: query, search attributes, UI details, the pipeline.

        ``wait=False`` (the steps that act on a job's end): the pipeline's signal goes out in the same workflow
        task as the step the caller schedules next, instead of that step waiting one more task for the signal's
        round trip (issue 37, end -> act; patch ACT_BEFORE_TELLING). Briefs still reach the pipeline in order
        (each waits for the one before), and every other call waits for any still in flight first, so none is
        in flight when the run ends, fails or continues as new."""
        changed = stage != self._status.stage
        if changed:
            self._observe(self._status.stage, stage, failure_class)
        self._status.stage = stage
        self._status.updated_at = workflow.now().isoformat()
        updates = [sa.STAGE.value_set(stage.value)]
        if failure_class:
            self._status.failure_class = failure_class
            updates.append(sa.FAILURE_CLASS.value_set(sa.keyword(failure_class)))
        elif stage == Stage.DONE:
            # A target that succeeded after a retried failure is not "failed with class X" any more.
            self._status.failure_class = None
            updates.append(sa.FAILURE_CLASS.value_unset())
        if not workflow.patched(patches.BOUNDED_WAITS):  # runs started before: every call, as they did
            workflow.upsert_search_attributes(updates)
            workflow.set_current_details(self._details())
            if changed or failure_class or stage == Stage.WAITING:
                await self._tell_pipeline(self._brief())
            return
        # Only real changes become events: a long wait re-checking every few minutes adds none.
        attributes = [stage.value, self._status.failure_class]
        if attributes != self._sent_attributes:
            workflow.upsert_search_attributes(updates)
            self._sent_attributes = attributes
        workflow.set_current_details(self._details())
        brief = self._brief()
        if brief != self._sent:
            if not wait and workflow.info().parent is not None and workflow.patched(patches.ACT_BEFORE_TELLING):
                self._sent = brief
                self._telling = asyncio.create_task(self._tell_after(self._telling, brief))
                return
            await self._flush_pipeline()
            await self._tell_pipeline(brief)
            self._sent = brief
        else:
            await self._flush_pipeline()

    async def _tell_after(self, before: asyncio.Task | None, brief: TargetBrief) -> None:
        if before is not None:
            await before
        await self._tell_pipeline(brief)

    async def _flush_pipeline(self) -> None:
        """Wait for a brief still on its way to the pipeline (sent by ``_set_stage(wait=False)``)."""
        if self._telling is not None:
            telling, self._telling = self._telling, None
            await telling

    def _observe(self, old: Stage, new: Stage, failure_class: str | None) -> None:
        """One log line and the domain metrics per real stage change (replay-safe, never per poll)."""
        now = workflow.now()
        if old == Stage.WAITING and self._waiting_since is not None:
            metrics.operator_wait("target", self._waiting_reason, (now - self._waiting_since).total_seconds())
            self._waiting_since = None
        if new == Stage.WAITING:
            self._waiting_since, self._waiting_reason = now, failure_class or "decision"
        metrics.stage_entered("target", new.value, failure_class=failure_class if new == Stage.FAILED else None)
        workflow.logger.info("%s: %s -> %s%s", self._inp.target.key, old.value, new.value,
                             f" ({failure_class})" if failure_class else "")

    def _details(self) -> str:
        st = self._status
        job = st.job_ids[-1] if st.job_ids else None
        note = f"job `{job}`" if job else ""
        if st.progress and st.progress.last_marker:
            note += f"; last marker: {st.progress.last_marker}"
        if st.message and st.stage in (Stage.DONE, Stage.FAILED, Stage.CANCELLED):
            note += ("\n\n" if note else "") + st.message
        return details_markdown(title=self._inp.target.key, stage=st.stage, note=note,
                                waiting=[st.waiting] if st.waiting else None)

    def _brief(self) -> TargetBrief:
        st = self._status
        return TargetBrief(key=st.key, stage=st.stage, job_id=st.job_ids[-1] if st.job_ids else None,
                           failure_class=st.failure_class, waiting=st.waiting)

    async def _tell_pipeline(self, brief: TargetBrief) -> None:
        """Send the parent pipeline this target's state (it shows ``waiting`` and per-target details)."""
        parent = workflow.info().parent
        if parent is None:
            return
        with workflow.unsafe.imports_passed_through():
            from workflows.pipeline import BuildPipelineWorkflow  # deferred: pipeline imports this module
        st = self._status
        try:
            await workflow.get_external_workflow_handle(parent.workflow_id).signal(
                BuildPipelineWorkflow.target_changed, brief)
        except Exception as e:  # noqa: BLE001 - a closed parent cannot be told; the child's own record stands
            if isinstance(e, asyncio.CancelledError):
                raise
            workflow.logger.info("could not tell the pipeline about %s: %s", st.key, e)


def _failure_message(key: str, f: FailureRecord, request_id: str) -> str:
    evidence = f.diagnostics.uri if f.diagnostics else "no diagnostics file"
    quoted = f"; failing line: {f.failing_line!r}" if f.failing_line else ""
    return (f"{key}: {f.failure_class} failure of {f.job_id} ({'; '.join(f.reasons[:3])}){quoted}; "
            f"evidence: {evidence} (`starter.py logs {request_id} {key}`); "
            f"next step: {(f.hint or 'inspect the evidence').replace('<workflow-id>', q(request_id))}")
