"""Activities that read the repositories: live build state, immutable source, plan, rebuild check.

Why activities: all of it is git I/O against remotes that change under us. Each is idempotent: the
mirror is refreshed, the managed worktree is reused or recreated, the build commit carries a
``Build-Request`` trailer and is found again on the remote branch after a crash, and the push is
fast-forward only.
"""

from __future__ import annotations

import asyncio
import shutil
from typing import Literal

import git
from temporalio import activity

from activities.common import (
    CONTRACT_PATHS,
    ActivityGroup,
    Heartbeater,
    input_error,
    iris_client,
)
from clients.bundle import BundleError, build_bundle
from clients.credentials import CredentialError, fetch_secret
from clients.git_source import (
    FetchedRepo,
    GitSourceError,
    RemoteRefused,
    WorktreeError,
    build_request_of,
    changed_paths,
    commit_build_change,
    create_worktree,
    diff_names,
    push_branch,
    read_blobs_at,
    read_files_at,
    repin_dockerfiles,
    resolve_ref,
)
from clients.github import GitHubError
from clients.identity import registry_user
from clients.iris import IrisError
from domain.boundary import BoundaryRule, decide
from domain.buildset import TargetSpec, plan_targets
from domain.contract import (
    AGENTS_PATH,
    OPS_PATH,
    BuildContract,
    ContractError,
    describe_disagreement,
    load_contract,
    ops_fix,
)
from domain.harbor_manifest import diff_manifests, extras_installed_by_dockerfile, parse_harbor_manifest
from domain.models import (
    BuildState,
    BundleSummary,
    HarborDiffSummary,
    LoadStateInput,
    PlanTargetsInput,
    PrepareSourceInput,
    RebuildCheckInput,
    RebuildDecision,
    SourceSnapshot,
)
from domain.pins import read_pins
from rehearsal.images import CredentialUnavailable, LookupSettings, check_target_images
from rehearsal.runner import TaskImages, rehearse_targets

HARBOR_PIN = "HARBOR_COMMIT"


class SourceActivities(ActivityGroup):
    def all(self) -> list:
        return [self.load_build_state, self.prepare_source, self.plan_targets, self.publish_source,
                self.rebuild_decision, self.earlier_rebuild]

    def _contract(self, repo: FetchedRepo, sha: str) -> BuildContract:
        try:
            return load_contract(self.repos.contract_files(repo, sha), sha, self.config.build)
        except ContractError as e:
            raise input_error(f"build contract at {sha[:12]}: {e}") from None
        except GitSourceError as e:
            raise input_error(f"build contract at {sha[:12]}: {e}") from None

    def branch_for(self, request_id: str) -> str:
        return self.config.repos.build_branch(request_id)

    # ------------------------------------------------------------------ 1. live build state
    @activity.defn
    async def load_build_state(self, inp: LoadStateInput) -> BuildState:
        return await asyncio.to_thread(self._load_build_state, inp)

    def _load_build_state(self, inp: LoadStateInput) -> BuildState:
        repo, harbor = self.repos.marinskyrl(), self.repos.harbor()
        try:
            base = resolve_ref(repo, inp.source_commit) if inp.source_commit else repo.head_sha
            harbor_commit = resolve_ref(harbor, inp.harbor_ref)
        except GitSourceError as e:
            raise input_error(f"--harbor-ref / source commit: {e}") from None
        c = self._contract(repo, base)
        return BuildState(
            base_commit=base, default_branch=repo.default_branch, harbor_commit=harbor_commit,
            harbor_pinned={p: d.pins.get(HARBOR_PIN, "") for p, d in c.dockerfiles.items()
                           if p in {a.dockerfile for a in c.script.arches.values()}},
            architectures=sorted(c.script.arches), policies=[p.text for p in c.agents.policy],
            disagreements=[describe_disagreement(d) for d in c.disagreements],
            fallbacks=[f"{f.field}: config:{f.config_key} ({f.reason})" for f in c.fallbacks]
            + [f"{c.ops.path}: not used: {note}" for note in c.ops.skipped])

    # ------------------------------------------------------------------ 2. immutable source
    @activity.defn
    async def prepare_source(self, inp: PrepareSourceInput) -> SourceSnapshot:
        try:
            return await asyncio.to_thread(self._prepare_source, inp)
        except BaseException:
            if inp.plan_only:  # a refused plan leaves nothing behind either (a retry re-creates the same commit)
                await asyncio.to_thread(self._discard_plan_files, inp.request_id)
            raise

    def _prepare_source(self, inp: PrepareSourceInput) -> SourceSnapshot:
        repo, harbor = self.repos.marinskyrl(), self.repos.harbor()
        branch = self.branch_for(inp.request_id)
        start = self._earlier_build_commit(repo, branch, inp.request_id, inp.base_commit) or inp.base_commit
        dest = self.paths.worktree(inp.request_id)
        try:
            wt = create_worktree(repo, start, dest)
        except WorktreeError as e:
            # The managed worktree is scratch (never an operator checkout): a crash mid-edit leaves it
            # dirty; start again from the remote truth instead of trusting half-written files.
            activity.logger.warning(f"recreating managed worktree: {e}")
            shutil.rmtree(dest, ignore_errors=True)
            wt = create_worktree(repo, start, dest)
        contract = self._contract(repo, inp.base_commit)
        dockerfiles = sorted({a.dockerfile for a in contract.script.arches.values()})
        old_pins = {df: contract.dockerfiles[df].pins.get(HARBOR_PIN) for df in dockerfiles}
        missing = [df for df, v in old_pins.items() if not v]
        if missing:
            raise input_error(f"{', '.join(missing)}: no `ARG {HARBOR_PIN}=` pin to update")
        diff = self._harbor_diff(harbor, old_pins, contract, inp.harbor_commit)
        try:
            repin_dockerfiles(wt, dockerfiles, {HARBOR_PIN: inp.harbor_commit})
        except GitSourceError as e:
            raise input_error(str(e)) from None
        digests_in, pin_table, pin_reason = self._pin_target(repo, inp.base_commit, contract)
        # Corrections are computed from the base commit, never from the worktree: a worktree (or a pushed
        # branch) that already holds the corrected doc gives the same answer, on any worker.
        try:
            fix = ops_fix(contract, pin_table=pin_table,
                          protected=self.config.github.do_not_touch if self.config.github else ())
        except ContractError as e:
            raise input_error(f"{e} (stale ops doc at {inp.base_commit[:12]}; nothing was built)") from None
        corrected = fix.text is not None
        if fix.text is not None:
            ops_path = wt / contract.ops.path
            if ops_path.read_text() != fix.text:
                ops_path.write_text(fix.text)
        message = (f"Bake Harbor {inp.harbor_commit[:12]} into the GPU-RL Dockerfiles\n\n"
                   f"Every architecture's Dockerfile pins HARBOR_COMMIT={inp.harbor_commit}.")
        if corrected:
            message += "\nCorrect stale ops documentation to match the build script."
        author = f"{self.config.repos.git_author_name} <{self.config.repos.git_author_email}>"
        # Dated like its base commit: the same request and inputs give the same sha on any worker,
        # so a worker that lost the worktree (or a retry after a crash) re-creates the very commit.
        base_date = git.Repo(wt).commit(inp.base_commit).committed_date
        result = commit_build_change(wt, message=message, request_id=inp.request_id, author=author,
                                     date=f"{base_date + 1} +0000")
        # Before the push: a refused bundle (a symlink, a suspicious file) leaves nothing behind.
        try:
            bundle = build_bundle(wt, self.paths.bundle(inp.request_id, result.sha),
                                  allow_suspicious=inp.allow_suspicious_files)
        except BundleError as e:
            raise input_error(f"Iris bundle of {result.sha[:12]} refused before submission: {e}") from None
        pushed = False
        if inp.push:
            try:
                # A re-run after a failure in recording finds its own pin commit on top: kept, not refused.
                push_branch(wt, self.config.repos.marinskyrl_url, branch, result.sha,
                            keep_own=(f"{inp.request_id}-pins",), credential=self.repos.git_credential)
            except RemoteRefused:
                raise  # no such remote, refused credential or permission: final, typed by the boundary
            except GitSourceError as e:
                raise input_error(f"push of {branch}: {e}") from None
            pushed = True
        return SourceSnapshot(
            build_commit=result.sha, base_commit=inp.base_commit, branch=branch, pushed=pushed,
            created_commit=result.sha != inp.base_commit, harbor_commit=inp.harbor_commit, harbor_diff=diff,
            changed_files=changed_paths(repo, inp.base_commit, result.sha) if result.sha != inp.base_commit
            and self._in_mirror(repo, result.sha) else diff_names(wt, inp.base_commit, result.sha),
            ops_doc_corrected=corrected, ops_corrections=[c.describe(contract.ops.path) for c in fix.corrections],
            digests_in=digests_in, pin_table=pin_table, pin_target_reason=pin_reason,
            bundle=BundleSummary(sha256=bundle.sha256, size_bytes=bundle.size_bytes, file_count=bundle.file_count,
                                 largest=[(p, s) for p, s in bundle.largest][:5],
                                 suspicious=[(p, r) for p, r in bundle.suspicious]))

    def _pin_target(self, repo: FetchedRepo, base: str, contract: BuildContract
                    ) -> tuple[Literal["pin_table", "pr_body"], str | None, str]:
        """Where the validated digests go, known before anything is built: the configured pin table when the
        repository has it, else the PR body and the issue (runbook). A pin table that is a protected file (the
        Iris training launcher) refuses the request now, naming the file."""
        gh = self.config.github
        path = gh.pin_table_path if gh else None
        if not path:
            return "pr_body", None, "no github.pin_table_path configured: digests go in the PR body and the issue"
        configured = set(gh.do_not_touch) if gh else set()
        if path in configured or path in contract.agents.do_not_touch:
            by = "github.do_not_touch" if path in configured else f"{contract.agents.path} policy"
            raise input_error(f"github.pin_table_path {path} is protected ({by}: the Iris training launcher "
                              "never receives digests, runbook); nothing was built. Point github.pin_table_path "
                              "at the repository's pin table, or at a path the repository lacks to record the "
                              "digests in the PR body and the issue")
        if path not in read_blobs_at(repo, base, [path], missing_ok=True):
            return "pr_body", None, (f"no pin table at {base[:12]} ({path}, config:github.pin_table_path): the PR "
                                     "carries the re-pinned Dockerfiles and ops doc fixes; the digests and their "
                                     "evidence go in the PR body and the issue (runbook)")
        return "pin_table", path, f"{path} at {base[:12]} (config:github.pin_table_path): the PR updates it"

    @staticmethod
    def _in_mirror(repo: FetchedRepo, sha: str) -> bool:
        try:
            resolve_ref(repo, sha)
            return True
        except GitSourceError:
            return False

    @staticmethod
    def _earlier_build_commit(repo: FetchedRepo, branch: str, request_id: str, base: str) -> str | None:
        """This request's build commit, if an earlier attempt already pushed it (crash after push)."""
        try:
            head = resolve_ref(repo, branch)
        except GitSourceError:
            return None
        commit = git.Repo(repo.path).commit(head)
        for c in (commit, *commit.parents[:1]):
            if build_request_of(c.message) == request_id and c.parents and c.parents[0].hexsha == base:
                return c.hexsha
        return None

    def _harbor_diff(self, harbor: FetchedRepo, old_pins: dict[str, str | None], contract: BuildContract,
                     new: str) -> HarborDiffSummary | None:
        olds = {v for v in old_pins.values() if v}
        old = sorted(olds)[0]
        if olds == {new}:
            return None
        try:
            texts_old = read_files_at(harbor, old, ["pyproject.toml"])
        except GitSourceError:
            return HarborDiffSummary(old=old, new=new, affects_image=True,
                                     lines=[f"pinned Harbor {old[:12]} is not in the Harbor remote; cannot diff"])
        texts_new = read_files_at(harbor, new, ["pyproject.toml"])
        extras: list[str] = []
        texts = read_files_at(self.repos.marinskyrl(), contract.commit, sorted(old_pins))
        for text in texts.values():
            extras.extend(e for e in extras_installed_by_dockerfile(text) if e not in extras)
        d = diff_manifests(parse_harbor_manifest(texts_old["pyproject.toml"]),
                           parse_harbor_manifest(texts_new["pyproject.toml"]), extras)
        lines = list(d.summary_lines)
        if len(olds) > 1:
            lines.insert(0, f"Dockerfiles disagreed on the Harbor pin ({', '.join(sorted(olds))}); all now pin {new}")
        return HarborDiffSummary(old=old, new=new, affects_image=d.affects_image, lines=lines)

    # ------------------------------------------------------------------ 3. plan
    @activity.defn
    async def publish_source(self, inp: PrepareSourceInput) -> SourceSnapshot:
        """Push the build branch, only after the plan validated (re-creating the same commit if needed)."""
        return await asyncio.to_thread(self._prepare_source, inp.model_copy(update={"push": True}))

    def _contract_at_build_commit(self, inp: PlanTargetsInput) -> tuple[BuildContract, str]:
        """The contract at the build commit, and the commit its cited lines refer to: the build commit
        once pushed (read from the mirror), else our worktree's files with the base commit's prose."""
        repo = self.repos.marinskyrl()
        if self._in_mirror(repo, inp.build_commit):
            return self._contract(repo, inp.build_commit), inp.build_commit
        if not inp.request_id:
            raise input_error(f"build commit {inp.build_commit[:12]} is neither pushed nor re-creatable")
        wt = self.paths.worktree(inp.request_id)
        if _head(wt) != inp.build_commit:  # another worker prepared it: re-create the same commit here
            snap = self._prepare_source(PrepareSourceInput(request_id=inp.request_id, base_commit=inp.base_commit,
                                                           harbor_commit=inp.harbor_commit, push=False,
                                                           allow_suspicious_files=inp.request.allow_suspicious_files))
            if snap.build_commit != inp.build_commit:
                raise input_error(f"re-created build commit {snap.build_commit[:12]} differs from "
                                  f"{inp.build_commit[:12]}: the inputs changed under the request")
        try:
            files = {p: (wt / p).read_bytes() for p in CONTRACT_PATHS if (wt / p).exists() or p.startswith("docker/")}
            files.update({f"docker/{p.name}": p.read_bytes() for p in (wt / "docker").glob("Dockerfile*")})
            # Not pushed yet: the prose is cited as the operator can open it, at the base commit (the
            # service's corrected copy exists only here). The script and Dockerfiles keep their line
            # numbers (the re-pin edits values in place), so one numbering holds for the whole plan.
            base = self.repos.contract_files(repo, inp.base_commit) if inp.base_commit else files
            for p in (OPS_PATH, AGENTS_PATH):
                if p in base:
                    files[p] = base[p]
                else:
                    files.pop(p, None)
            return load_contract(files, inp.build_commit, self.config.build), inp.base_commit
        except (OSError, ContractError) as e:
            raise input_error(f"build contract at {inp.build_commit[:12]}: {e}") from None

    @activity.defn
    async def plan_targets(self, inp: PlanTargetsInput) -> list[TargetSpec]:
        try:
            return await self._plan_targets(inp)
        finally:
            if inp.plan_only:  # nothing else reads them: the plan's answer is its report
                await asyncio.to_thread(self._discard_plan_files, inp.request_id or f"plan-{inp.build_commit[:12]}")

    def _discard_plan_files(self, rid: str) -> None:
        """A --plan's worktrees (prepared and rehearsal) and bundles; a retry re-creates them (same commit)."""
        for path in (self.paths.worktree(rid), self.paths.worktree(f"{rid}-rehearsal"),
                     self.paths.bundle(rid, "0" * 12).parent):
            shutil.rmtree(path, ignore_errors=True)

    async def _plan_targets(self, inp: PlanTargetsInput) -> list[TargetSpec]:
        contract, lines_at = await asyncio.to_thread(self._contract_at_build_commit, inp)
        for arch, cluster in inp.request.clusters.items():
            if cluster not in self.config.clusters:
                raise input_error(f"--cluster {arch}={cluster}: cluster {cluster!r} is not configured "
                                  f"(configured: {', '.join(sorted(self.config.clusters))})")
        # Every input check first, against the configured architectures: a refusal never waits on a
        # controller. Then the live architecture of only the clusters the plan uses, read concurrently
        # with a short per-cluster deadline (live state wins; an unanswered cluster keeps its config).
        configured = {name: c.architecture for name, c in self.config.clusters.items() if c.architecture}
        targets = self._plan(contract, inp, configured)
        needed = sorted({t.cluster for t in targets if t.cluster in self.config.clusters})
        live = await _live_architectures(self.config, needed, self.config.policy.plan_cluster_deadline_s)
        if any(configured.get(name) != arch for name, arch in live.items()):
            targets = self._plan(contract, inp, {**configured, **live})
        for t in targets:
            t.lines_at = lines_at
            t.allow_suspicious_files = inp.request.allow_suspicious_files
        unknown = sorted({f"{t.architecture}→{t.cluster}" for t in targets if t.cluster not in self.config.clusters})
        if unknown:
            archs = sorted({t.architecture for t in targets if t.cluster not in self.config.clusters})
            raise input_error(f"planned cluster(s) {', '.join(unknown)} (from {contract.ops.path} placements) are "
                              f"not configured (clusters: {', '.join(sorted(self.config.clusters))}); add them "
                              "to the configuration or pass --cluster ARCH=CLUSTER"
                              + cluster_suggestion(archs, configured))
        async with Heartbeater(every_s=2.0):
            failure = await asyncio.to_thread(self._rehearse, inp, contract, targets)
            if not failure:
                failure = await self._check_images(inp, contract, targets)
        if failure:
            raise input_error(failure)
        return targets

    async def _check_images(self, inp: PlanTargetsInput, contract: BuildContract,
                            targets: list[TargetSpec]) -> str | None:
        """Ask each image the build pulls in its registry for the target's platform (rehearsal/images.py)."""
        settings = LookupSettings(mirrors=dict(self.config.policy.rehearsal_registry_mirrors),
                                  insecure_hosts=tuple(self.config.registry.insecure_hosts),
                                  job_host=self.config.registry.image_repository.partition("/")[0],
                                  realm_hosts=tuple(self.config.registry.token_realm_hosts))

        async def job_credentials() -> tuple[str, str]:
            try:  # only the job's own registry gets them, as in the job's docker config
                token = await asyncio.to_thread(fetch_secret, self.config.registry.token, what="registry.token")
                return await asyncio.to_thread(registry_user, self.config, token), token
            except (CredentialError, GitHubError) as e:
                raise CredentialUnavailable(str(e)) from None

        return await check_target_images(contract, targets, settings, harbor_commit=inp.harbor_commit,
                                         mode=self.config.policy.rehearsal,
                                         accept_unrehearsed=inp.request.accept_unrehearsed,
                                         credentials=job_credentials)

    def _plan(self, contract: BuildContract, inp: PlanTargetsInput, cluster_archs: dict[str, str]) -> list[TargetSpec]:
        try:
            return plan_targets(contract, inp.request, build_commit=inp.build_commit,
                                harbor_commit=inp.harbor_commit, cluster_archs=cluster_archs,
                                image_repository_override=self.config.registry.image_repository,
                                registry_host=self.config.registry.image_repository.partition("/")[0])
        except (ValueError, ContractError) as e:
            raise input_error(str(e)) from None

    def _rehearse(self, inp: PlanTargetsInput, contract: BuildContract, targets: list[TargetSpec]) -> str | None:
        """Run every planned command in the rehearsal (rehearsal/runner.py) against the build commit's bundle."""
        repo = self.repos.marinskyrl()
        rid = inp.request_id or f"plan-{inp.build_commit[:12]}"
        wt = self.paths.worktree(rid)
        if _head(wt) != inp.build_commit:  # pushed by an earlier run: a managed worktree at the build commit
            wt = create_worktree(repo, inp.build_commit, self.paths.worktree(f"{rid}-rehearsal"))
        try:
            bundle = build_bundle(wt, self.paths.bundle(rid, inp.build_commit),
                                  allow_suspicious=inp.request.allow_suspicious_files)
        except BundleError as e:
            raise input_error(f"Iris bundle of {inp.build_commit[:12]} refused before submission: {e}") from None
        policy = self.config.policy
        images = TaskImages(self.config.rehearsal_image_cache(), mirrors=policy.rehearsal_registry_mirrors,
                            insecure_hosts=self.config.registry.insecure_hosts)
        return rehearse_targets(
            contract, targets, bundle_path=bundle.path, bundle_sha256=bundle.sha256,
            script_text=(wt / contract.script.path).read_text(), harbor_commit=inp.harbor_commit,
            cluster_env={t.cluster: dict(self.config.cluster(t.cluster).job_env) for t in targets},
            images=images, mode=policy.rehearsal, accept_unrehearsed=inp.request.accept_unrehearsed,
            isolation=policy.rehearsal_isolation, emulators=policy.rehearsal_emulators)

    # ------------------------------------------------------------------ 4. scheduled rebuild check
    @activity.defn
    async def rebuild_decision(self, inp: RebuildCheckInput) -> RebuildDecision:
        return await asyncio.to_thread(self._rebuild_decision, inp)

    @activity.defn
    async def earlier_rebuild(self, workflow_id: str) -> str:
        """Empty unless the pipeline of these very commits was cancelled by an operator (its run ended
        CANCELED: `starter.py cancel` or the UI); then when, for the rebuild check to hold it."""
        from temporalio.client import WorkflowExecutionStatus
        from temporalio.service import RPCError, RPCStatusCode

        try:
            desc = await activity.client().get_workflow_handle(workflow_id).describe()
        except RPCError as e:
            if e.status == RPCStatusCode.NOT_FOUND:
                return ""
            raise
        if desc.status != WorkflowExecutionStatus.CANCELED:
            return ""
        at = desc.close_time.strftime("%Y-%m-%d %H:%M UTC") if desc.close_time else "earlier"
        return f"an operator cancelled {workflow_id} ({at})"

    def _rebuild_decision(self, inp: RebuildCheckInput) -> RebuildDecision:
        """Per variant: each pinned image is compared with the head from its own pinned source and Harbor
        commits, so variants pinned at different commits (an operator's standard-only build) are judged one by
        one; a variant rebuilds only when a change that crosses the boundary reached it since its own pin."""
        repo, harbor = self.repos.marinskyrl(), self.repos.harbor()
        src = repo.head_sha
        try:
            harbor_head = resolve_ref(harbor, inp.request.harbor_ref) if inp.request.harbor_ref else harbor.head_sha
        except GitSourceError as e:
            raise input_error(f"harbor_ref {inp.request.harbor_ref!r}: {e}") from None
        contract = self._contract(repo, src)
        gh = self.config.github
        pin_path = gh.pin_table_path if gh else "cloud/iris/gpu_rl_images.py"
        table = read_files_at(repo, src, [pin_path], missing_ok=True).get(pin_path)
        pins = read_pins(table) if table is not None else {}
        rules = [BoundaryRule(glob=r.glob, rebuild=r.rebuild, reaches=r.reaches, source=r.source)
                 for r in contract.deploy_boundary]
        changed_since: dict[str, list[str]] = {}
        deciding: list[str] = []
        others: list[str] = []
        rebuild: list[str] = []
        quiet: list[str] = []
        for arch in inp.request.architectures:
            dockerfile = contract.script.arches[arch].dockerfile if arch in contract.script.arches else None
            texts = read_files_at(repo, src, [dockerfile]) if dockerfile else {}
            for variant in inp.request.variants:
                key = f"{arch}-{variant}"
                pin = pins.get((arch.upper(), variant.upper())) or {}
                last, last_harbor = pin.get("source_commit"), pin.get("harbor_commit")
                if not last or not self._in_mirror(repo, last):
                    rebuild.append(key)
                    deciding.append((f"no pinned image in {pin_path}" if table is not None and not pin
                                     else f"no pin table at {pin_path}" if table is None
                                     else f"the pinned source {last or '-'} is not a commit known to the "
                                          f"repository ({pin_path})") + f"; rebuild to re-establish provenance ({key})")
                    continue
                if last not in changed_since:
                    changed_since[last] = changed_paths(repo, last, src)
                verdict = decide(rules, texts, changed_since[last], harbor_moved=bool(last_harbor) and
                                 last_harbor != harbor_head, old_harbor=last_harbor, new_harbor=harbor_head)
                at = f" ({key}, since its pin at {last[:12]})"
                if verdict.needed:
                    rebuild.append(key)
                    deciding += [r + at for r in verdict.deciding]
                    others += [r + at for r in verdict.reasons if r not in verdict.deciding]
                else:
                    quiet.append(f"{key} ({last[:12]})")
                    others += [r + at for r in verdict.reasons]
        if rebuild:
            reasons = deciding + others
        else:
            reasons = [f"no rebuild needed: no change crossed the rebuild boundary for any variant since its own "
                       f"pin: {', '.join(quiet)}"] + others
        lasts = {(pins.get((a.upper(), v.upper())) or {}).get("source_commit") for a in inp.request.architectures
                 for v in inp.request.variants}
        last_harbors = {(pins.get((a.upper(), v.upper())) or {}).get("harbor_commit")
                        for a in inp.request.architectures for v in inp.request.variants}
        return RebuildDecision(
            needed=bool(rebuild), reasons=reasons, source_commit=src, harbor_commit=harbor_head,
            last_source_commit=lasts.pop() if len(lasts) == 1 else None,
            last_harbor_commit=last_harbors.pop() if len(last_harbors) == 1 else None,
            changed_paths=sorted({p for paths in changed_since.values() for p in paths}), rebuild_targets=rebuild)


async def _live_architectures(config, clusters: list[str], deadline_s: float) -> dict[str, str]:
    """The architecture each cluster's controller reports (its workers' attribute), asked of all clusters
    at once, each within ``deadline_s``: a cluster that is down or slow keeps its configured value."""
    async def one(name: str) -> tuple[str, str | None]:
        async def ask() -> str | None:
            async with iris_client(config, name) as iris:
                return await iris.cluster_arch_hint()
        try:
            return name, await asyncio.wait_for(ask(), deadline_s)
        except (IrisError, OSError, TimeoutError) as e:
            activity.logger.warning(f"cluster {name}: no live architecture within {deadline_s:g}s "
                                    f"({e or type(e).__name__}); using configuration")
            return name, None
    return {name: arch for name, arch in await asyncio.gather(*(one(n) for n in clusters)) if arch}


def _head(wt) -> str | None:
    """HEAD of a clean managed worktree, or None (absent or dirty)."""
    try:
        repo = git.Repo(wt)
        return None if repo.is_dirty(untracked_files=True) else repo.head.commit.hexsha
    except (git.exc.GitError, ValueError, OSError):
        return None



def cluster_suggestion(archs: list[str], configured: dict[str, str]) -> str:
    """`` (pass: --cluster amd64=X ...)`` for each architecture exactly one configured cluster runs, so the
    refusal's next step (domain/outcome.input_failure) is a command that runs as printed; '' otherwise."""
    flags = []
    for arch in archs:
        names = sorted(name for name, declared in configured.items() if declared == arch)
        if len(names) != 1:
            return ""
        flags.append(f"--cluster {arch}={names[0]}")
    return f" (pass: {' '.join(flags)})" if flags else ""
