"""Activities of one target: submit the Iris job, poll it, judge its log, capture failures, validate.

Each is idempotent under retry: the job name is deterministic and a re-submit attaches; polls and
captures only read; evidence files are rewritten whole. Secrets are fetched here, at execution time,
and go only into the Iris job's environment.
"""

from __future__ import annotations

import asyncio
import base64
import functools
import json
import time
from pathlib import Path

from temporalio import activity
from temporalio.client import WorkflowExecutionStatus
from temporalio.service import RPCError, RPCStatusCode

from activities.common import (
    ActivityGroup,
    Heartbeater,
    heartbeat,
    input_error,
    iris_client,
    safe_name,
    write_evidence,
    write_json_evidence,
)
from activities.errors import Transient
from activities.log_reads import LogReads
from clients.bundle import BundleError, build_bundle
from clients.credentials import CredentialError, fetch_secret
from clients.evidence import EvidenceError, read_evidence, read_named
from clients.git_source import create_worktree, read_files_at
from clients.github import GitHubError
from clients.identity import registry_user
from clients.image_validator import validate_image
from clients.iris import (
    ClientTooOld,
    CompleteLog,
    GpuRequest,
    IrisError,
    JobInfo,
    LaunchSpec,
    LogServerUnavailable,
    NotFound,
    Resources,
    Unavailable,
)
from clients.kube import KubeEvidence, PodFacts
from clients.registry import NotFound as RegistryNotFound
from clients.registry import (
    RateLimited,
    RegistryClient,
    RegistryError,
    RegistryUnavailable,
    scheme_for,
    warm_pool,
)
from domain.config import ConfigError, PolicySettings
from domain.contract import load_contract
from domain.evidence import failing_line
from domain.failures import AttemptEvidence, Evidence, classify
from domain.jobs import registry_has_our_image, submission_name
from domain.log_evidence import (
    MAX_GAPS_VERIFIED,
    ImageFacts,
    ImageRun,
    LogIntegrity,
    built_by_job,
    cached_values_confirmed,
    image_check_script,
    image_check_steps,
    judge,
    needs_image,
    read_image_run,
    seq_gaps,
    unexplained_gaps,
    with_image_run,
)
from domain.markers import check_log
from domain.models import (
    AdoptInput,
    AdoptResult,
    CapturedFailure,
    CaptureInput,
    JobProgress,
    LogCheck,
    LogCheckInput,
    MonitorInput,
    SubmitInput,
    SubmittedJob,
    TargetInput,
    TargetResult,
    TerminateInput,
    ValidateInput,
    target_workflow_id,
)
from domain.redact import redact
from domain.validation import ExpectedImage, ValidationReport, check_claimed_digest

LOG_PAGE_LINES = 5000


# The registry the real build contract pushes to (ghcr.io/marin-community/...), warmed at worker start when
# [registry] image_repository does not name another one.
DEFAULT_REGISTRY_HOST = "ghcr.io"


class BuildActivities(ActivityGroup):
    @functools.cached_property
    def log_reads(self) -> LogReads:
        """Terminal jobs' logs read once per worker (activities/log_reads.py)."""
        return LogReads(Path(self.config.work_dir).expanduser() / "log-reads")

    def all(self) -> list:
        return [self.policy, self.submit_job, self.monitor_job, self.check_build_log, self.capture_failure,
                self.validate_image, self.terminate_jobs, self.adopt_validated]

    @activity.defn
    async def policy(self) -> PolicySettings:
        """The retry/timer policy, read from configuration when the target starts."""
        return self.config.policy

    # ------------------------------------------------------------------ submit
    @activity.defn
    async def submit_job(self, inp: SubmitInput) -> SubmittedJob:
        t, job = inp.target, inp.target.job
        try:
            cluster = self.config.cluster(job.cluster)
        except ConfigError as e:
            raise input_error(str(e)) from None
        name = submission_name(job.job_name, generation=inp.generation, round_=inp.round)
        wire_name = f"/{cluster.iris_user}/{name}"
        async with iris_client(self.config, job.cluster) as iris:
            # A retried activity (or a new worker after a crash) finds the job this submission launched;
            # a new request generation has another name, so it never attaches to a job an earlier run
            # terminated or saw fail.
            try:
                existing = await iris.job_status(wire_name, with_tasks=False)
                return SubmittedJob(job_id=existing.job_id or wire_name, cluster=job.cluster, attached=True,
                                    submitted_at_ms=existing.submitted_at_ms or 0)
            except NotFound:
                pass
            spec = await asyncio.to_thread(self._launch_spec, inp, wire_name)
            before = await self._record_tag_before(inp.request_id, t, wire_name)
            try:
                job_id, launched = await iris.submit_idempotent(spec)
            except ClientTooOld as e:
                raise input_error(str(e)) from None
            except IrisError as e:
                if e.transient:
                    raise
                raise input_error(f"Iris refused {wire_name} on {job.cluster}: {e}") from None
        if job_id != wire_name:  # check_build_log reads it by the controller's job id
            await write_json_evidence(self.evidence, inp.request_id, tag_before_name(job_id), before)
        activity.logger.info(f"{'launched' if launched else 'attached to'} {job_id} for {t.key}")
        return SubmittedJob(job_id=job_id, cluster=job.cluster, attached=not launched,
                            submitted_at_ms=int(time.time() * 1000))

    async def _record_tag_before(self, request_id: str, t, job_name: str) -> dict:
        """Before the job exists: what the target's tag holds (a digest, none, or unknown and why), in the evidence
        store under the job's name. Written once: a retried submit that attaches keeps the first reading.
        check_build_log reads it to tell an image this job pushed from one that was already at the tag."""
        name = tag_before_name(job_name)
        earlier = await asyncio.to_thread(read_named, self.evidence, request_id, name)
        if earlier is not None:
            return json.loads(earlier)
        ref = f"{t.image_repository}:{t.tag}"
        record: dict = {"ref": ref, "digest": None, "known": True, "read_at_ms": int(time.time() * 1000)}
        host, _, repo = t.image_repository.partition("/")
        try:
            async with RegistryClient(host, scheme=scheme_for(host, tuple(self.config.registry.insecure_hosts)),
                                      credentials=await self._registry_credentials(t), pool=self.registry_pool) as reg:
                record["digest"] = (await reg.head_manifest(repo, t.tag)).digest
        except RegistryNotFound:
            pass  # nothing at the tag: any image there later was pushed after this reading
        except (RegistryUnavailable, RateLimited) as e:
            raise Transient(f"registry: cannot read {ref} before submitting ({e}); asking again") from None
        except RegistryError as e:
            record.update(known=False, note=f"{ref} could not be read before the submission: {e}")
        await write_json_evidence(self.evidence, request_id, name, record)
        return record

    async def _registry_credentials(self, t) -> tuple[str, str] | None:
        bound = self.config.registry.image_repository.partition("/")[0].lower()
        if t.image_repository.partition("/")[0].lower() != bound:
            return None
        try:
            token = await asyncio.to_thread(fetch_secret, self.config.registry.token, what="registry.token")
            return await asyncio.to_thread(registry_user, self.config, token), token
        except (CredentialError, GitHubError):
            return None

    def _launch_spec(self, inp: SubmitInput, wire_name: str) -> LaunchSpec:
        """Re-read the script at the build commit, satisfy every required variable, bundle, add secrets."""
        t, job = inp.target, inp.target.job
        repo = self.repos.marinskyrl()
        files = self.repos.contract_files(repo, inp.build_commit)
        contract = load_contract(files, inp.build_commit, self.config.build)  # fails closed on anything unrecognized
        names = {e.name for e in job.env}
        decided = {e.name: (e.value if e.value is not None else "<secret>") for e in job.env}
        decided.setdefault(contract.script.wheel_source_var, t.wheel_source)
        missing = sorted(set(contract.script.required_when(decided)) - names)
        if missing:
            raise input_error(f"{job.script_path} at {inp.build_commit[:12]} requires {', '.join(missing)}, "
                              f"which the job spec for {t.key} does not set")
        bound = self.config.registry.image_repository.partition("/")[0].lower()
        if t.image_repository.partition("/")[0].lower() != bound:  # planned before the binding existed
            raise input_error(f"{t.key}: image repository {t.image_repository} is not on {bound} "
                              "(config:registry.image_repository); the registry token is not sent there")
        env: dict[str, str] = {}
        for e in job.env:  # a CredentialError is mapped by the boundary (activities/errors.py)
            if e.secret == "registry_user":
                env[e.name] = registry_user(self.config)  # its own value, or registry.token's owner
            elif e.secret == "registry_token":
                env[e.name] = fetch_secret(self.config.registry.token, what="registry.token")
            else:
                env[e.name] = e.value or ""
        if job.script_env_var:
            script = read_files_at(repo, inp.build_commit, [job.script_path])[job.script_path]
            env[job.script_env_var] = base64.b64encode(script.encode()).decode()
        env.update(self.config.cluster(job.cluster).job_env)
        worktree = create_worktree(repo, inp.build_commit, self.paths.worktree(f"{inp.request_id}-submit-{t.key}"))
        try:
            bundle = build_bundle(worktree, self.paths.bundle(inp.request_id, inp.build_commit),
                                  allow_suspicious=t.allow_suspicious_files)
        except BundleError as err:
            raise input_error(f"Iris bundle of {inp.build_commit[:12]}: {err}") from None
        return launch_spec(job, wire_name, env, bundle.path.read_bytes())

    # ------------------------------------------------------------------ monitor
    @activity.defn
    async def monitor_job(self, inp: MonitorInput) -> JobProgress:
        """Poll authoritative job state until terminal or ``return_after_s``; never infer from logs.

        Only target runs started before the cluster watcher (``workflows/patches.py`` CLUSTER_WATCHER) call
        this; new runs are woken by ``activities/watch.py``. Remove once no such run is open.

        An unreachable controller is reported (``controller_reachable=False``) and polled again; only
        the controller's own terminal state, or the job vanishing, ends monitoring."""
        pol = self.config.policy
        started = time.monotonic()
        interval = pol.poll_min_interval_s
        progress = JobProgress(job_id=inp.job_id, state="unknown", terminal=False, log_cursor=inp.log_cursor,
                               last_marker=inp.last_marker)
        last_state = None
        # One client (and, for tunnelled clusters, one port-forward) per call, not per poll.
        async with iris_client(self.config, inp.cluster) as iris:
            while True:
                try:
                    info = await iris.job_status(inp.job_id)
                    progress = _progress(info, progress)
                    progress.log_cursor, progress.last_marker = await _scan_markers(
                        iris, inp.job_id, progress.log_cursor, progress.last_marker, inp.markers)
                except LogServerUnavailable as e:  # the state above was read; only the progress lines were not
                    progress.error = f"log progress not read: {e}"
                except NotFound:
                    progress.state, progress.terminal, progress.missing = "missing", True, True
                    progress.error = f"{inp.job_id} is no longer known to the controller (pruned?); not a success"
                except Unavailable as e:
                    progress.controller_reachable = False
                    progress.error = f"controller unreachable: {e}"
                heartbeat(progress.model_dump(mode="json"))
                if progress.terminal or time.monotonic() - started >= inp.return_after_s:
                    return progress
                # Adaptive: poll fast right after a change, back off while nothing moves.
                interval = pol.poll_min_interval_s if progress.state != last_state else min(
                    interval * 1.5, pol.poll_max_interval_s)
                last_state = progress.state
                await asyncio.sleep(min(interval, max(0.1, inp.return_after_s - (time.monotonic() - started))))

    # ------------------------------------------------------------------ judge the log of a succeeded job
    @activity.defn
    async def check_build_log(self, inp: LogCheckInput) -> LogCheck:
        """Judge a succeeded job: its log proves the markers it shows; where it cannot (empty, seq holes, a
        marker absent: the store drops lines without a trace, domain/log_evidence.py) the pushed image
        stands in, and a marker neither proves ends the target as ``log_lost`` at once (no read-again loop)."""
        await asyncio.to_thread(self.learn_secrets_once)  # the log is kept redacted (activities/log_reads.py)
        markers = inp.target.expected_markers
        image: ImageFacts | None = None
        # The whole log is in memory from its read to its evidence: a bounded number of end phases at once per
        # worker (activities/log_reads.py LOG_SLOTS), so 200 targets ending together do not hold 200 logs.
        async with Heartbeater(), self.log_reads.slot(), iris_client(self.config, inp.cluster) as iris:
            # Read once per worker: a retry reads only lines after the saved cursor, none once complete.
            saved = await self.log_reads.read(inp.job_id, lambda start: _complete_log(iris, inp.job_id, start))
            log = saved.log
            if not log.complete:  # never judge markers on a log that is still arriving
                raise Transient(f"the log of {inp.job_id} still grew {log.waited_s:.0f} s after the job ended "
                                f"({len(log.entries)} lines so far); reading it again")
            text = _log_text(log)
            result = check_log(markers, text)
            if any(m.cache_proof and m.name in result.cached for m in markers):
                # A cached value step is ours only where no ENV of the image (its base image's too) sets the value.
                image = await self._image_facts(inp, result.pushed_digest)
                result = cached_values_confirmed(markers, result, image)
            integrity = LogIntegrity(lines=len(log.entries))
            if needs_image(result, integrity):  # only then do holes matter: ask the store about the seq gaps
                integrity = await self.log_reads.integrity(saved, lambda lg: _integrity_counted(iris, lg))
            ref = await write_evidence(self.evidence, inp.request_id, f"{safe_name(inp.job_id)}.log", text)
            del saved, log, text  # the registry's answer below may take long: hold nothing of the log meanwhile
        if image is None and needs_image(result, integrity):
            image = await self._image_facts(inp, result.pushed_digest)
        j = judge(markers, result, integrity, image)
        if j.verdict == "log_lost" and image is not None and image.ours and image.digest and (
                image.built_by_job or (image.built_by_job is False and image.adoption_allowed)):
            steps = image_check_steps(markers, j.unproven)
            if steps:  # the image can answer some of what the log lost: run its own checks
                j = with_image_run(j, await self._run_image_checks(inp, image, markers, steps, j.unproven))
        if j.verdict != "log":
            activity.logger.info(f"{inp.job_id}: log incomplete ({'; '.join(j.incomplete)}); {j.verdict}: "
                                 f"{len(j.stood_in)} marker(s) proven by the image, {len(j.missing)} by nothing")
        return LogCheck(log=ref, found=j.found, missing=j.missing, cached=j.cached, final_push_seen=j.final_push_seen,
                        pushed_digest=j.pushed_digest, incomplete=j.incomplete, stood_in=j.stood_in,
                        lost=j.reasons if j.verdict == "log_lost" else [], contradicted=j.contradicted,
                        unproven=j.unproven if j.verdict == "log_lost" else {}, lost_cause=j.cause,
                        image_digest=image.digest if image is not None and j.stood_in else None)

    async def _run_image_checks(self, inp: LogCheckInput, image: ImageFacts, markers, steps: list[str],
                                unproven: dict[str, str]) -> ImageRun:
        """Run the steps in the image itself: an Iris job on the target's cluster (its architecture) whose task
        image is the pushed digest, with a small CPU request and no retries, bounded by
        policy.image_check_timeout_s (the pull included; it is terminated beyond that). Its name derives from
        the build job's, so a retried step attaches to it. Its log is read like a build's (complete, then judged)."""
        t = inp.target
        ref = f"{t.image_repository}@{image.digest}"
        name = f"{inp.job_id.rstrip('/')}-image-check"
        cluster = self.config.cluster(inp.cluster)
        asked = [m.name for m in markers if m.name in unproven and m.check_step and m.step in steps]
        spec = LaunchSpec(
            name=name, argv=[*cluster.image_check_runner, "bash", "-c", image_check_script(markers, steps)],
            env={**cluster.job_env, "GPU_RL_BUILDER_IMAGE": ref},
            resources=Resources(cpu_millicores=1000, memory_bytes=8 * 1024**3, disk_bytes=t.job.resources.disk_bytes
                                if t.job.resources.disk_bytes else 100 * 1024**3),
            max_retries_failure=0, max_retries_preemption=2, task_image=ref,
            timeout_s=self.config.policy.image_check_timeout_s)
        deadline = time.monotonic() + self.config.policy.image_check_timeout_s + 60
        try:
            async with iris_client(self.config, inp.cluster) as iris:
                job_id, _ = await iris.submit_idempotent(spec)
                while True:
                    info = await iris.job_status(job_id, with_tasks=False)
                    heartbeat({"image_check": job_id, "state": info.state.value})
                    if info.is_terminal:
                        break
                    if time.monotonic() > deadline:
                        await iris.terminate(job_id)
                        return ImageRun(ref=ref, job_id=job_id, asked=asked, error=(
                            f"the image check job {job_id} did not end within "
                            f"{self.config.policy.image_check_timeout_s} s (policy.image_check_timeout_s); terminated"))
                    await asyncio.sleep(1.0)
                log = await _complete_log(iris, job_id)
        except LogServerUnavailable:
            raise  # the image's output is unread, not absent: the step is retried (Transient), nothing unproven
        except (IrisError, NotFound) as e:
            return ImageRun(ref=ref, asked=asked, error=f"the image check job could not run: {e}")
        text = _log_text(log)
        await write_evidence(self.evidence, inp.request_id, f"{safe_name(job_id)}.log", text)
        run = read_image_run(ref, job_id, text, markers, steps, unproven)
        if info.state.value != "succeeded" and not run.proven and not run.contradicted:
            run.error = f"the image check job {job_id} ended {info.state.value}" + (f": {info.error}" if info.error
                                                                                    else "")
        activity.logger.info(f"{inp.job_id}: image check {job_id} on {ref}: {len(run.proven)} proven, "
                             f"{len(run.contradicted)} contradicting line(s), {len(run.failed)} not proven")
        return run

    async def _image_facts(self, inp: LogCheckInput, pushed: str | None = None) -> ImageFacts:
        """The image at the target's tag as evidence for a log that lost lines: ours (labels), its digest, its
        config history, and whether this job pushed it (``built_by``). A registry that gives no verdict is asked
        again (Transient, bounded)."""
        t = inp.target
        ref = f"{t.image_repository}:{t.tag}"
        if not inp.build_commit:
            return ImageFacts(ref=ref, not_ours_reason="the step was scheduled without the build commit to check")
        configs: list[dict] = []
        report = await self._validate(ValidateInput(target=t, build_commit=inp.build_commit,
                                                    harbor_commit=inp.harbor_commit or ""),
                                      on_config=configs.append)
        if report.awaiting_registry:
            raise Transient(f"registry: no verdict on {ref} ({report.failure_summary()}), which must stand in for "
                            f"the incomplete log of {inp.job_id}; asking again")
        ours = registry_has_our_image(report)
        labels = [c for c in report.checks if c.name.startswith("label:") and c.verdict != "pass"]
        why = "" if ours else (
            f"no image at {ref} ({report.failure_summary()})" if not report.digest
            else f"{ref}@{report.digest} is not this build's: " + ("; ".join(
                f"{c.name} is {c.observed}, expected {c.expected}" for c in labels) or "it has no OCI labels"))
        history = (configs[0].get("history") if configs else None) or []
        env = ((configs[0].get("config") or {}).get("Env") or []) if configs else None
        before = await asyncio.to_thread(read_named, self.evidence, inp.request_id, tag_before_name(inp.job_id))
        built, built_why = built_by_job(
            digest=report.digest, platform_digest=report.platform_digest, pushed=pushed,
            before=json.loads(before) if before is not None else None,
            created=str(configs[0].get("created") or "") if configs else "")
        return ImageFacts(ref=ref, digest=report.digest, ours=ours, not_ours_reason=why,
                          history=[str(h.get("created_by") or "") for h in history if isinstance(h, dict)],
                          history_present=bool(history), built_by_job=built, built_why=built_why,
                          adoption_allowed=self.config.policy.allow_adopted_image,
                          env_keys=[str(e).partition("=")[0] for e in env or []], env_present=env is not None)

    # ------------------------------------------------------------------ capture and classify a failure
    @activity.defn
    async def capture_failure(self, inp: CaptureInput) -> CapturedFailure:
        """Job summary, every attempt, the whole log, pod termination reason and events → one file."""
        cluster = self.config.cluster(inp.cluster)
        diag: dict = {"job_id": inp.job_id, "cluster": inp.cluster, "target": inp.target_key}
        info: JobInfo | None = None
        attempts: list = []
        text = ""
        facts: list[PodFacts] = []
        async with Heartbeater():
            try:
                async with iris_client(self.config, inp.cluster) as iris:
                    info = await iris.job_status(inp.job_id)
                    diag["summary"] = info.model_dump(mode="json")
                    for task in info.tasks:
                        full = await iris.task_status(task.task_id)
                        attempts.extend(full.attempts)
                        diag.setdefault("tasks", []).append(full.model_dump(mode="json"))
                    log = await _complete_log(iris, inp.job_id)
                    text = _log_text(log)
                    diag["log_complete"] = log.complete  # False: still growing at the bound (kept as is)
            except NotFound:
                diag["summary"] = {"state": "missing", "note": "the controller no longer knows this job"}
            if cluster.kubeconfig:
                kube = KubeEvidence(cluster.kubectl, cluster.kubeconfig, cluster.kube_context)
                pods = {a.pod_name for a in attempts if a.pod_name} | {
                    t.container_id for t in (info.tasks if info else []) if t.container_id}
                facts = [await kube.collect(p) for p in sorted(pods)]
                diag["kubernetes"] = [f.model_dump(mode="json") for f in facts]
        name = safe_name(inp.job_id)
        log_ref = await write_evidence(self.evidence, inp.request_id, f"{name}.log", text)
        # Classification reasons reach history: they are built from the redacted log only.
        await asyncio.to_thread(self.learn_secrets)
        text = redact(text)
        evidence = _evidence(info, attempts, facts, text, inp.missing_markers, inp.log_lost, inp.contradicted,
                             inp.log_lost_cause)
        c = classify(evidence)
        c = c.model_copy(update={"reasons": [redact(r) for r in c.reasons]})  # Iris errors carry stderr too
        quoted = failing_line(text) if text else None
        diag["evidence"] = evidence.model_dump(mode="json")
        diag["classification"] = c.model_dump(mode="json")
        diag["log"] = log_ref.model_dump()
        diag["failing_line"] = quoted
        ref = await write_json_evidence(self.evidence, inp.request_id, f"{name}.diagnostics.json", diag)
        activity.logger.info(f"{inp.job_id}: {c.failure_class} ({'; '.join(c.reasons)}); evidence {ref.uri}")
        return CapturedFailure(classification=c, diagnostics=ref, log=log_ref, failing_line=quoted)

    @activity.defn
    async def terminate_jobs(self, inp: TerminateInput) -> list[str]:
        """Terminate exactly the jobs we submitted (never by prefix: that would reach other jobs)."""
        done = []
        async with iris_client(self.config, inp.cluster) as iris:
            for job_id in inp.job_ids:
                try:
                    await iris.terminate(job_id)
                    done.append(job_id)
                except NotFound:
                    pass
        return done

    # ------------------------------------------------------------------ adopt an earlier validated build
    @activity.defn
    async def adopt_validated(self, inp: AdoptInput) -> AdoptResult:
        """The validated result of an earlier run of this build commit, when it still holds: its target
        workflow completed validated for the same build commit, tag and repository; its build log is in
        the evidence store with the recorded sha256; and the registry still serves the same digest at
        the tag, passing validation now. Then nothing is rebuilt (a rebuild with real kaniko gives a new
        digest, and the earlier one may already be pinned). The record is Temporal's own history of that
        run, so nothing extra is written for it."""
        t = inp.target
        handle = activity.client().get_workflow_handle(target_workflow_id(inp.request_id, t.key),
                                                       result_type=TargetResult)
        try:
            desc = await handle.describe()
        except RPCError as e:
            if e.status == RPCStatusCode.NOT_FOUND:
                return AdoptResult(reason="no earlier run of this target")
            raise Transient(f"Temporal: {e.message}") from None
        if desc.status != WorkflowExecutionStatus.COMPLETED:
            return AdoptResult(reason=f"the earlier run ended {desc.status.name.lower()}")
        done = await handle.result()
        earlier: TargetInput | None = None
        async for event in handle.fetch_history_events(page_size=1):
            payloads = event.workflow_execution_started_event_attributes.input.payloads
            earlier = (await activity.client().data_converter.decode(payloads, [TargetInput]))[0]
            break
        if done.status != "validated" or not done.digest or done.log_check is None:
            return AdoptResult(reason=f"the earlier run ended {done.status} without a validated digest")
        if earlier is None or (earlier.build_commit, earlier.target.tag, earlier.target.image_repository) != (
                inp.build_commit, t.tag, t.image_repository):
            return AdoptResult(reason="the earlier run built another commit, tag or repository")
        try:
            await asyncio.to_thread(read_evidence, done.log_check.log, self.config.evidence.storage_options)
        except EvidenceError as e:
            return AdoptResult(reason=f"its evidence is not in the store as recorded: {e}")
        report = await self._validate(ValidateInput(target=t, build_commit=inp.build_commit,
                                                    harbor_commit=inp.harbor_commit))
        if report.awaiting_registry:
            raise Transient(f"registry: no verdict on {t.image_repository}:{t.tag} "
                            f"({report.failure_summary()}); asking again")
        if report.digest != done.digest:
            return AdoptResult(reason=f"{t.tag} now points at {report.digest or 'nothing'}, not the validated "
                                      f"{done.digest}")
        if not report.ok:
            return AdoptResult(reason=f"{t.image_repository}:{t.tag} no longer passes validation: "
                                      f"{report.failure_summary()}")
        source = f"{desc.id} run {desc.run_id}"
        activity.logger.info(f"{t.key}: adopting {done.image_ref}@{done.digest} validated by {source}")
        return AdoptResult(reason=f"validated by {source}", result=done.model_copy(update={
            "validation": report, "adopted_from": source,
            "message": f"{t.key}: {done.image_ref}@{done.digest} adopted from {source} (no new Iris job)"}))

    # ------------------------------------------------------------------ validate the published image
    async def warm_registry(self) -> str:
        """At worker start (not an activity): open the registry connection the validations share (TCP,
        TLS, SSL context) and, with the push identity, its pull token, so the first validation costs what
        every later one does. Never fails the worker: a registry that does not answer now is met again
        by the first validation. Returns what was warmed (for the worker's log)."""
        image_repository = self.config.registry.image_repository or DEFAULT_REGISTRY_HOST
        host, _, repo = image_repository.partition("/")
        scheme = scheme_for(host, tuple(self.config.registry.insecure_hosts))
        creds = None
        try:
            creds = (fetch_secret(self.config.registry.user, what="registry.user"),
                     fetch_secret(self.config.registry.token, what="registry.token"))
        except CredentialError:
            pass
        return await warm_pool(self.registry_pool, host, repo, scheme=scheme, credentials=creds)

    @activity.defn
    async def validate_image(self, inp: ValidateInput) -> ValidationReport:
        return await self._validate(inp)

    async def _validate(self, inp: ValidateInput, on_config=None) -> ValidationReport:
        t = inp.target
        ceiling = t.layer_ceiling
        if ceiling is None:  # planned before targets carried it: read it from the contract at the build commit
            repo = await asyncio.to_thread(self.repos.marinskyrl)
            files = await asyncio.to_thread(self.repos.contract_files, repo, inp.build_commit)
            ceiling = load_contract(files, inp.build_commit, self.config.build).layer_ceiling
        creds = None
        bound = self.config.registry.image_repository.partition("/")[0].lower()
        try:
            if t.image_repository.partition("/")[0].lower() != bound:
                raise CredentialError(f"registry.token is bound to {bound}, not {t.image_repository}")
            # Off the event loop: a credential command (`gh auth token`, a vault CLI) may take seconds.
            token = await asyncio.to_thread(fetch_secret, self.config.registry.token, what="registry.token")
            creds = (await asyncio.to_thread(registry_user, self.config, token), token)
        except (CredentialError, GitHubError) as err:
            activity.logger.warning(f"validating without registry credentials: {err}")
        expected = ExpectedImage(platform=t.kaniko_platform, revision=inp.build_commit,
                                 harbor_commit=inp.harbor_commit, min_layers=ceiling.min_layers,
                                 max_layer_bytes=ceiling.max_layer_bytes, warn_layer_bytes=ceiling.warn_layer_bytes)
        async with Heartbeater():
            report = await validate_image(image_repository=t.image_repository, tag=t.tag, expected=expected,
                                          credentials=creds, insecure_hosts=self.config.registry.insecure_hosts,
                                          pool=self.registry_pool, on_config=on_config)
        return check_claimed_digest(report, inp.claimed_digest)


def tag_before_name(job_name: str) -> str:
    """The evidence file holding what the target's tag held before ``job_name`` was submitted."""
    return f"{safe_name(job_name)}.tag-before.json"


def launch_spec(job, wire_name: str, env: dict[str, str], bundle_blob: bytes | None) -> LaunchSpec:
    """The LaunchJob request for a planned job (``domain.buildset.JobSpec``). ``--max-retries N`` becomes
    what ``iris job run`` sends: ``maxRetriesFailure=N`` and ``maxTaskFailures=N`` (LaunchSpec's default)."""
    r = job.resources
    gpu = None
    if r.gpu:
        variant, _, count = r.gpu.partition("x")
        gpu = GpuRequest(variant=variant, count=int(count or 1))
    return LaunchSpec(
        name=wire_name, argv=list(job.command), env=env, bundle_blob=bundle_blob,
        resources=Resources(cpu_millicores=int(r.cpu * 1000), memory_bytes=r.memory_bytes,
                            disk_bytes=r.disk_bytes, gpu=gpu),
        max_retries_failure=job.max_retries_failure, max_retries_preemption=job.max_retries_preemption,
        timeout_s=job.timeout_s or None, priority_band=job.priority, task_image=job.task_image)


def _progress(info: JobInfo, prev: JobProgress) -> JobProgress:
    now_ms = time.time() * 1000
    start = info.started_at_ms or info.submitted_at_ms
    end = info.finished_at_ms or now_ms
    attempt = max((t.current_attempt_id for t in info.tasks), default=0)
    return prev.model_copy(update=dict(
        state=info.state.value, terminal=info.is_terminal, attempt=attempt,
        preemptions=info.preemption_count, failures=info.failure_count,
        elapsed_s=max(0.0, (end - start) / 1000) if start else 0.0,
        pending_reason=info.pending_reason or None, error=info.error or None, controller_reachable=True))


async def _scan_markers(iris, job_id: str, cursor: int, last: str | None, markers: list[str]):
    """Read new log lines since ``cursor`` and remember the latest build marker seen (progress only)."""
    if not markers:
        return cursor, last
    for _ in range(20):
        page = await iris.fetch_logs(f"{job_id}/", "prefix", cursor=cursor, max_lines=LOG_PAGE_LINES)
        for line in page.lines:
            for m in markers:
                if m in line:
                    last = m
        advanced = bool(page.entries) and page.cursor != cursor
        if advanced:
            cursor = page.cursor
        if not advanced or len(page.entries) < LOG_PAGE_LINES:  # a short page is the end: no extra request
            break
    return cursor, last


async def _complete_log(iris, job_id: str, start: CompleteLog | None = None) -> CompleteLog:
    """Every line of the terminal job (all tasks and attempts), re-read until it stops growing: lines
    flushed after the terminal state are part of what is judged (clients/iris.py read_complete_log).
    ``start``: what an earlier attempt read (only later lines are read; nothing when it was complete)."""
    return await iris.read_complete_log(f"{job_id}/", "prefix", page_lines=LOG_PAGE_LINES,
                                        on_read=lambda n: heartbeat({"log_lines": n}), start=start)


async def _integrity_counted(iris, log: CompleteLog) -> tuple[LogIntegrity, int]:
    """``_integrity`` and the log requests it took (one per verified gap)."""
    integrity = await _integrity(iris, log)
    return integrity, integrity.gaps_checked


async def _integrity(iris, log: CompleteLog) -> LogIntegrity:
    """The log's own evidence of loss: empty, or seq gaps between its lines that no key of the store fills
    (each candidate gap costs one read of at most a page; beyond MAX_GAPS_VERIFIED, or a gap wider than a
    page, it is counted as not verified, never as a hole). Asked only when a marker is missing: on a busy
    controller a long build's lines have thousands of gaps, all other jobs' lines."""
    gaps = seq_gaps((e.key, e.seq) for e in log.entries if e.seq)
    checked = [g for g in gaps if g.ids <= LOG_PAGE_LINES][:MAX_GAPS_VERIFIED]
    stored = {(g.after, g.before): await iris.stored_rows_between(g.after, g.before) for g in checked}
    return LogIntegrity(lines=len(log.entries), gaps_checked=len(checked), gaps_unverified=len(gaps) - len(checked),
                        holes=unexplained_gaps(checked, stored))


def _log_text(log: CompleteLog) -> str:
    lines = [f"[{e.key} {e.source}] {e.data}" for e in log.entries]
    return "\n".join(lines) + ("\n" if lines else "")


def _evidence(info: JobInfo | None, attempts: list, facts: list[PodFacts], log_text: str,
              missing_markers: list[str], log_lost: list[str] = (), contradicted: list[str] = (),
              log_lost_cause: str = "log") -> Evidence:
    """Fold Iris state, attempts, pod facts and the log tail into the classifier's input."""
    last_pod = facts[-1] if facts else None
    return Evidence(
        job_state=info.state.value if info else "missing",
        error=info.error if info else "",
        attempts=[AttemptEvidence(state=a.state.value, exit_code=a.exit_code, error=a.error,
                                  is_worker_failure=a.is_worker_failure) for a in attempts],
        pod_termination_reason=last_pod.termination_reason or last_pod.status_reason if last_pod else None,
        pod_exit_code=last_pod.exit_code if last_pod else None,
        pod_condition_reasons=[r for f in facts for r in f.condition_reasons],
        pod_waiting_reason=last_pod.waiting_reason if last_pod else None,
        k8s_event_reasons=[r for f in facts for r in f.event_reasons],
        log_tail=[line.split("] ", 1)[-1] for line in log_text.splitlines()[-200:]],
        missing_markers=missing_markers,
        log_lost=list(log_lost),
        log_lost_cause="cache" if log_lost_cause == "cache" else "log",
        contradicted=list(contradicted),
    )
