"""Activities that record the artifact: pin table commit, PR with evidence, issue comment, CI watch, merge.

Idempotent under retry and crash: the pin commit carries a request trailer and is found again; the
PR is found by its head branch and edited; the issue comment is found by a hidden marker and edited;
merge is done with the expected head SHA, so a moved head is never merged blindly.
"""

from __future__ import annotations

import asyncio
import shutil
import subprocess
import time
from datetime import UTC, datetime

import git
import httpx
from temporalio import activity

from activities.common import ActivityGroup, Heartbeater, heartbeat, input_error
from activities.merge_gate import gate_reader, verify_operator
from clients.child_env import child_env
from clients.credentials import CredentialError, fetch_secret
from clients.git_source import (
    DirtyWorktree,
    DivergedWorktree,
    GitSourceError,
    adopt_pushed_commit,
    build_request_of,
    changed_paths,
    commit_build_change,
    create_worktree,
    is_ancestor,
    last_change_of,
    list_files_at,
    push_branch,
    read_files_at,
    replay_commit,
    reset_worktree,
    resolve_ref,
    restore_paths,
    worktree_changes,
)
from clients.github import (
    ConditionalCache,
    GitHubClient,
    HeadMoved,
    NotMergeable,
    RateLimited,
    comment_marker,
)
from clients.identity import github_auth, registry_user
from clients.image_validator import probe_anonymous_pull
from clients.registry import (
    Denied,
    RegistryClient,
    RegistryError,
    scheme_for,
    split_image_repository,
)
from clients.registry import NotFound as RegistryNotFound
from clients.registry import Unauthorized as RegistryUnauthorized
from domain.boundary import BoundaryRule, decide
from domain.config import GitHubSettings
from domain.contract import ContractError, load_contract
from domain.github_pace import watch_pace
from domain.issue_ref import parse_issue_ref
from domain.models import (
    ConflictInput,
    ConflictVerdict,
    MergeInput,
    PinnedImage,
    PullRequestInfo,
    RecordInput,
    RegistryDrift,
    ReviewState,
    WatchInput,
)
from domain.outcome import drift_markdown, pinned_images, registry_drift
from domain.pins import PinEntry, PinTableError, read_pins, update_pin_table
from domain.redact import redact
from domain.render import inert_markdown
from domain.report import evidence_lines, target_rows
from runtime.temporal import workflow_ui_url

SLOWED_LOG_EVERY_S = 600.0  # a watch slowed by a low rate limit says so once, then every 10 minutes
REGISTRY_CHECK_TIMEOUT_S = 10.0  # one pinned-tag read while a PR waits; no answer = keep what was known


class RecordActivities(ActivityGroup):
    def __init__(self, config):
        super().__init__(config)
        # ETags and bodies of this worker's GitHub reads: consecutive PR watches (one per state change,
        # one an hour otherwise) poll with conditional requests; a 304 costs no rate limit. Memory only.
        self.github_cache = ConditionalCache()

    def all(self) -> list:
        return [self.record_artifact, self.watch_pull_request, self.merge_pull_request, self.resolve_conflict]

    def _github(self) -> tuple[GitHubSettings, GitHubClient]:
        gh = self.config.github
        if gh is None:
            raise input_error("github: no [github] section in the configuration; cannot open a PR")
        # A token, or the App installation's provider (minted on the first request, refreshed near expiry);
        # a CredentialError is mapped by the boundary.
        return gh, GitHubClient(gh.api_url, github_auth(gh), self.config.repos.marinskyrl_slug,
                                cache=self.github_cache)

    # ------------------------------------------------------------------ pin + PR + comment
    @activity.defn
    async def record_artifact(self, inp: RecordInput) -> PullRequestInfo:
        gh_settings, gh = self._github()
        src = inp.source
        bad = [t.key for t in inp.targets if t.status != "validated" or not t.digest]
        if bad:
            raise input_error(f"refusing to pin targets without a validated digest: {', '.join(bad)}")
        async with Heartbeater():
            pin_commit, base_branch = await asyncio.to_thread(self._commit_pins, inp, gh_settings)
            # A tag moved (or a package made private) since validation: the pin stays the validated digest,
            # and the PR says what the registry serves now (the merge wait holds the merge until it is fixed).
            drift = await self.registry_drift(pinned_images(inp.targets)) or []
        body = self._pr_body(inp, drift)
        title = f"Pin GPU-RL images built from {src.build_commit[:12]} (Harbor {src.harbor_commit[:12]})"
        async with gh:
            pull = await gh.ensure_pull(src.branch, base_branch, title, body)
            comment_url = None
            if inp.request.issue_url:
                comment_url = await self._comment_on_issue(gh, inp, body)
        return PullRequestInfo(number=pull.number, url=pull.html_url or f"#{pull.number}", head_sha=pull.head_sha,
                               state=pull.state, pin_commit=pin_commit, issue_comment_url=comment_url)

    @staticmethod
    async def _comment_on_issue(gh: GitHubClient, inp: RecordInput, body: str) -> str:
        """One comment per build on the issue ``--issue-url`` names, in the repository it names."""
        repo, number = parse_issue_ref(inp.request.issue_url).in_repo(gh.repo)
        target = gh if repo.lower() == gh.repo.lower() else gh.for_repo(repo)
        return (await target.upsert_comment(number, comment_marker(f"build-{inp.request_id}"), body)).html_url

    def _commit_pins(self, inp: RecordInput, gh: GitHubSettings) -> tuple[str, str]:
        src = inp.source
        repo = self.repos.marinskyrl()
        if src.digests_in == "pr_body":
            # Decided at plan time: the repository has no pin table, so the PR is the build commit (re-pinned
            # Dockerfiles, ops doc fixes) and the digests with their evidence go in its body and the issue.
            return src.build_commit, repo.default_branch
        dest = self.paths.worktree(f"{inp.request_id}-record")
        try:
            wt = create_worktree(repo, src.build_commit, dest)
        except (DirtyWorktree, DivergedWorktree) as e:
            # Our scratch clone, left half-edited by a failed attempt: start again from the build commit
            # (the pin commit is reproducible, so nothing is lost).
            activity.logger.warning(f"recreating the record worktree: {e}")
            shutil.rmtree(dest, ignore_errors=True)
            wt = create_worktree(repo, src.build_commit, dest)
        # A reused scratch clone may hold an earlier attempt's pin commit: write the table on the build
        # commit again (what is already pushed is found below, by content).
        reset_worktree(wt, src.build_commit)
        path = wt / gh.pin_table_path
        # Configured and repository policy (AGENTS.md, e.g. the Iris training launcher) both protect files.
        protected = set(gh.do_not_touch) | set(self._policy_protected(repo, src.build_commit))
        if gh.pin_table_path in protected:
            raise input_error(f"github.pin_table_path {gh.pin_table_path} is protected (github.do_not_touch / "
                              "AGENTS.md); refusing to write it")
        try:
            text = path.read_text()
        except FileNotFoundError:
            raise input_error(f"{gh.pin_table_path}: pin table not found at {src.build_commit[:12]}") from None
        entries = [PinEntry(architecture=t.architecture, variant=t.variant, digest=t.digest, tag=t.tag,
                            source_commit=src.build_commit, harbor_commit=src.harbor_commit) for t in inp.targets]
        try:
            path.write_text(update_pin_table(text, entries, path=gh.pin_table_path))
        except PinTableError as e:
            raise input_error(str(e)) from None
        if gh.lint_command:
            # Repository code: it gets the allow-listed environment, none of the service's credentials.
            out = subprocess.run(gh.lint_command, cwd=wt, capture_output=True, text=True, timeout=900,
                                 env=child_env())
            if out.returncode != 0:
                raise input_error(f"lint command {' '.join(gh.lint_command)} failed: {redact(out.stderr[-2000:])}")
        forbidden = sorted(set(worktree_changes(wt)) & protected)
        if forbidden:
            restore_paths(wt, forbidden)
            raise input_error(f"refusing to modify {', '.join(forbidden)} (github.do_not_touch / AGENTS.md); "
                              "nothing was committed")
        # A re-run after a failure in recording (or a retry on another worker) finds the pin commit it
        # already pushed: same content → the same commit, no second one that could only be forced.
        pins_request = f"{inp.request_id}-pins"
        existing = adopt_pushed_commit(wt, self.config.repos.marinskyrl_url, src.branch, request_id=pins_request,
                                       parent=src.build_commit, credential=self.repos.git_credential)
        if existing:
            return existing, repo.default_branch
        result = commit_build_change(
            wt, message=f"Pin GPU-RL images built from {src.build_commit[:12]}\n\n"
                        f"Validated digests for {', '.join(t.key for t in inp.targets)}; "
                        f"Harbor {src.harbor_commit}.",
            request_id=pins_request,
            author=f"{self.config.repos.git_author_name} <{self.config.repos.git_author_email}>",
            # Fixed date (one second after the build commit), like the build commit: a retry on any worker,
            # in an empty work directory, makes the same sha, so the push finds its own commit.
            date=f"{git.Repo(wt).commit(src.build_commit).committed_date + 1} +0000")
        # A pin commit of this request already on the branch with other content (a target rebuilt since,
        # with a new digest) is replaced: our own commit on our own branch, with a lease on exactly it.
        push_branch(wt, self.config.repos.marinskyrl_url, src.branch, result.sha, replace_own=pins_request,
                    credential=self.repos.git_credential)
        return result.sha, repo.default_branch

    def _policy_protected(self, repo, sha: str) -> list[str]:
        try:
            return load_contract(self.repos.contract_files(repo, sha), sha, self.config.build).agents.do_not_touch
        except (ContractError, GitSourceError):
            return []

    def _pr_body(self, inp: RecordInput, drift: list[RegistryDrift] | None = None) -> str:
        src, req = inp.source, inp.request
        url = workflow_ui_url(self.config, inp.request_id)
        lines = ["Automated GPU-RL image build by gpu-rl-builder.", ""]
        if req.compatibility_request:
            cr = req.compatibility_request  # operator text: rendered inert (no HTML, mentions, closing keywords)
            lines += [f"Compatibility image requested by **{inert_markdown(cr.requested_by)}**: "
                      f"{inert_markdown(cr.reason)}" + (f" ({inert_markdown(cr.link)})" if cr.link else ""), ""]
        lines += [f"- source revision: `{src.build_commit}`", f"- Harbor revision: `{src.harbor_commit}`",
                  f"- Temporal workflow: {url or inp.request_id}",
                  f"- legacy image path, tracked for removal in {self.config.github.tracking_issue_url}"
                  if self.config.github else "", ""]
        lines += target_rows(inp.targets) + [""]
        if src.digests_in == "pr_body":
            lines += [f"Digests recorded here and in the issue, not in a pin table ({src.pin_target_reason}):"]
            lines += [f"- `{t.key}`: `{t.image_ref.rsplit(':', 1)[0] if t.image_ref else ''}@{t.digest}` "
                      f"(tag `{t.tag}`, source `{src.build_commit[:12]}`, Harbor `{src.harbor_commit[:12]}`)"
                      for t in inp.targets] + [""]
        elif src.digests_in == "pin_table":
            lines += [f"Digests pinned in `{src.pin_table}` by this PR.", ""]
        if src.ops_doc_corrected:
            lines += [f"Stale ops documentation corrected in the build commit (file:line at base "
                      f"`{src.base_commit[:12]}`; the script and the runbook win):"]
            # Upstream prose: rendered inert (no HTML, mentions, closing keywords).
            lines += [f"- {inert_markdown(c)}" for c in src.ops_corrections] or ["- (lines not recorded)"]
            lines.append("")
        if drift:
            lines += drift_markdown(drift) + [""]
        for t in inp.targets:
            v = t.validation
            if v:
                lines.append(f"<details><summary>{t.key} validation</summary>\n")
                lines += ["| check | expected | observed | verdict |", "|---|---|---|---|"]
                lines += [f"| {c.name} | {c.expected} | {c.observed} | {c.verdict} |" for c in v.checks]
                lines.append("\n</details>\n")
        if evidence := evidence_lines(inp.targets):
            lines += ["Evidence (`starter.py evidence " + inp.request_id + "`):", *evidence, ""]
        if src.harbor_diff:
            lines += [f"Harbor dependency diff `{src.harbor_diff.old[:12]}`..`{src.harbor_diff.new[:12]}`:"]
            # Upstream text: rendered inert like operator text (no HTML, mentions, closing keywords, links).
            lines += [f"- {inert_markdown(x)}" for x in src.harbor_diff.lines] or ["- no dependency change"]
        return "\n".join(lines)

    # ------------------------------------------------------------------ the registry, as someone else left it
    def _registry_credentials(self, image_repository: str) -> tuple[str, str] | None:
        bound = self.config.registry.image_repository.partition("/")[0].lower()
        if image_repository.partition("/")[0].lower() != bound:
            return None  # the registry token is never sent to another host
        try:
            token = fetch_secret(self.config.registry.token, what="registry.token")
            return registry_user(self.config, token), token
        except CredentialError as e:
            activity.logger.warning(f"checking pinned images without registry credentials: {e}")
            return None

    async def registry_drift(self, images: list[PinnedImage]) -> list[RegistryDrift] | None:
        """What someone else changed in the registry since validation: each pinned tag still at its validated
        digest, and that digest still anonymously pullable. None when the registry gave no clear answer (5xx,
        429, network): the caller keeps what it knew, so a registry blip neither holds nor releases a merge."""
        out: list[RegistryDrift] = []
        for img in images:
            try:
                host, repo = split_image_repository(img.image_repository)
            except ValueError:
                continue
            scheme = scheme_for(host, tuple(self.config.registry.insecure_hosts))
            creds = await asyncio.to_thread(self._registry_credentials, img.image_repository)
            at_tag: str | None = img.digest
            anonymous, why = None, ""
            try:
                async with RegistryClient(host, scheme=scheme, credentials=creds, max_retries=1,
                                          timeout_s=REGISTRY_CHECK_TIMEOUT_S) as client:
                    try:
                        at_tag = (await client.head_manifest(repo, img.tag)).digest
                    except RegistryNotFound:
                        at_tag = None
            except (RegistryUnauthorized, Denied) as e:
                anonymous, why = False, str(e)  # our own read refused: the package is private to us too
            except (RegistryError, httpx.HTTPError) as e:
                activity.logger.warning(f"registry check of {img.image_repository}:{img.tag}: no answer ({e})")
                return None
            if anonymous is None and at_tag == img.digest:
                probe = await probe_anonymous_pull(host, repo, img.digest, scheme=scheme, max_retries=1)
                if probe.verdict == "inconclusive":
                    return None
                anonymous, why = probe.verdict == "pullable", probe.detail
            if d := registry_drift(img, at_tag=at_tag, anonymous=anonymous, anonymous_detail=why):
                out.append(d)
        return out

    async def _report_drift(self, gh: GitHubClient, inp: WatchInput, drift: list[RegistryDrift]) -> None:
        """One PR comment per build about registry drift, edited as it changes (resolved: says so)."""
        if not inp.request_id:
            return
        body = "\n".join(drift_markdown(drift)) if drift else (
            "**Registry changed since validation**: resolved — the registry serves every pinned image as "
            "validated again; the merge is no longer held by it.")
        await gh.upsert_comment(inp.pr_number, comment_marker(f"registry-drift-{inp.request_id}"), body)

    # ------------------------------------------------------------------ watch + merge
    @activity.defn
    async def watch_pull_request(self, inp: WatchInput) -> ReviewState:
        """Poll the PR until its gate state changes (or ``return_after_s``), heartbeating: required checks
        (branch protection / rulesets, else configured), reviews that block, operators' approvals on GitHub.
        Faster while an authorization waits for green (``policy.merge_watch_authorized_interval_s``).

        Every read is a conditional request (``self.github_cache``): on an idle PR each round is answered
        304, which costs no rate limit. When GitHub says the token's budget runs low the watch slows down
        (``domain.github_pace``; logged and heartbeated), and a rate limit it hits is waited out here
        while that fits in ``return_after_s``, rather than failing the attempt."""
        _, gh = self._github()
        policy = self.config.policy
        every = policy.merge_watch_authorized_interval_s if inp.authorized else policy.merge_watch_interval_s
        started = time.monotonic()
        slowed: float | None = None  # when the watch last logged that it slowed down (monotonic)
        drift = list(inp.known_drift)  # what the PR comment says now: a change is commented, a resolution too
        looked: float | None = None  # when the registry was last asked (monotonic)
        look = 0  # GitHub reads of this attempt, in the heartbeat: repeated beats of one look show one number
        async with gh:
            reader = gate_reader(gh, self.config)
            while True:
                before = (gh.requests, gh.not_modified)
                if inp.images and (looked is None or time.monotonic() - looked >= policy.merge_watch_registry_interval_s):
                    # Pinned tags and visibility, as someone else may have left them (cheap HEADs, less often).
                    looked = time.monotonic()
                    async with Heartbeater(every_s=2.0):  # a slow registry must not look like a dead worker
                        seen = await self.registry_drift(inp.images)
                    if seen is not None and seen != drift:
                        activity.logger.warning(f"PR watch #{inp.pr_number}: registry drift now "
                                                f"{[d.detail for d in seen] or 'resolved'}")
                        await self._report_drift(gh, inp, seen)
                    drift = drift if seen is None else seen
                try:
                    state = await reader.state(inp.pr_number, inp.overrides, pin=inp.pin_commit, images=inp.images)
                except RateLimited as e:
                    wait = e.wait_seconds()
                    if time.monotonic() - started + wait >= inp.return_after_s:
                        raise  # the boundary retries after the limit resets
                    activity.logger.warning(f"PR watch #{inp.pr_number}: GitHub rate limit hit ({e.status}); "
                                            f"waiting {wait:.0f} s before reading again")
                    heartbeat({"pr": inp.pr_number, "github": {"rate_limited_wait_s": round(wait)}})
                    await asyncio.sleep(wait)
                    continue
                if drift:
                    state = state.model_copy(update={"registry_drift": drift})
                counted = (gh.requests - before[0]) - (gh.not_modified - before[1])
                rate = gh.rate
                pace = watch_pace(every, limit=rate and rate.limit, remaining=rate and rate.remaining,
                                  reset_at=rate and rate.reset_at, cost=counted, now=datetime.now(UTC))
                now = time.monotonic()
                if pace.reason and (slowed is None or now - slowed >= SLOWED_LOG_EVERY_S):
                    activity.logger.warning(f"PR watch #{inp.pr_number}: {pace.reason}")
                    slowed = now
                elif pace.reason is None and slowed is not None:
                    activity.logger.info(f"PR watch #{inp.pr_number}: GitHub rate limit recovered; "
                                         f"watching every {every:g} s again")
                    slowed = None
                look += 1
                heartbeat({**state.model_dump(mode="json"), "github": {
                    "look": look, "requests": gh.requests - before[0], "not_modified": gh.not_modified - before[1],
                    "rate_remaining": rate and rate.remaining, "interval_s": round(pace.interval_s, 1),
                    "slowed": pace.reason}})
                elapsed = time.monotonic() - started
                if state != inp.last or elapsed >= inp.return_after_s:
                    return state
                # The last look lands on return_after_s, so a slowed watch still returns in time.
                await asyncio.sleep(min(pace.interval_s, max(0.1, inp.return_after_s - elapsed)))

    @activity.defn
    async def merge_pull_request(self, inp: MergeInput) -> ReviewState:
        """Merge the pin commit (``inp.head_sha``) and nothing else, after checking the authorization again on
        this worker: the login must still be a configured operator (an authorization carried for weeks, or
        recorded by an older version that took the name on trust, is never merged on its word alone).
        GitHub is given that sha, so a head moved since this look is refused (409), never merged."""
        _, gh = self._github()
        overrides = inp.authorization.override_checks if inp.authorization else []
        async with gh:
            reader = gate_reader(gh, self.config)

            async def state() -> ReviewState:
                return await reader.state(inp.pr_number, overrides, pin=inp.head_sha, images=inp.images)

            pull = await gh.get_pull(inp.pr_number)
            if pull.merged:
                return await state()
            if pull.head_sha != inp.head_sha:
                activity.logger.warning(f"merge of #{inp.pr_number} held: its head is {pull.head_sha[:12]}, not "
                                        f"the pin commit {inp.head_sha[:12]}")
                return await state()
            auth = inp.authorization
            verified = auth and await verify_operator(gh, self.config.operators, auth.by, strict=False)
            if not verified:
                activity.logger.warning(f"merge of #{inp.pr_number} refused: "
                                        f"{auth.by if auth else 'nobody'} is not a configured operator")
                return await state()
            # Once more right before merging: a tag moved since the watch last looked holds the merge.
            async with Heartbeater(every_s=2.0):
                drift = await self.registry_drift(inp.images) if inp.images else None
            if drift:
                activity.logger.warning(f"merge of #{inp.pr_number} held: {[d.detail for d in drift]}")
                return (await state()).model_copy(update={"registry_drift": drift})
            try:
                await gh.merge_pull(inp.pr_number, inp.head_sha)
            except (HeadMoved, NotMergeable) as e:
                activity.logger.warning(f"merge of #{inp.pr_number} refused: {e}")
                refused = f"GitHub refused the merge ({e.status}): {e.message}"
                return (await state()).model_copy(update={"merge_refused": refused})
            return await state()

    # ------------------------------------------------------------------ a PR that cannot merge
    @activity.defn
    async def resolve_conflict(self, inp: ConflictInput) -> ConflictVerdict:
        """The PR cannot merge because main moved. Judge main's new commits and resolve what the service owns:
        main already pins images of the same or a newer source → superseded (naming that build); the new commits
        cross the rebuild boundary → the validated images no longer match main (rebuild); else the build
        commit's change and the pin lines are written again on the new main and pushed, with a lease on exactly
        the old pin commit. Reproducible (fixed author and dates: a retry makes the same commits, and a pushed
        one is found again), so idempotent under retry."""
        async with Heartbeater():
            verdict = await asyncio.to_thread(self._resolve_conflict, inp)
        if verdict.kind == "superseded" and inp.pr_number is not None:
            # Its own PR can never merge: closed, saying why (one comment per build, edited on retry).
            _, gh = self._github()
            async with gh:
                await gh.upsert_comment(inp.pr_number, comment_marker(f"superseded-{inp.request_id}"),
                                        f"Superseded: {verdict.detail}. This PR cannot merge without overwriting "
                                        "newer pins; closed by gpu-rl-builder.")
                await gh.close_pull(inp.pr_number)
        return verdict

    def _resolve_conflict(self, inp: ConflictInput) -> ConflictVerdict:
        gh = self.config.github
        if gh is None:
            raise input_error("github: no [github] section in the configuration; cannot resolve a PR conflict")
        path = gh.pin_table_path
        repo = self.repos.marinskyrl()
        main = resolve_ref(repo)
        table = read_files_at(repo, main, [path], missing_ok=True).get(path)
        pins = read_pins(table) if table is not None else {}
        mine = [t for t in inp.targets if t.status == "validated" and t.digest]
        sources = [(pins.get((t.architecture.upper(), t.variant.upper())) or {}).get("source_commit") for t in mine]
        if mine and all(src and is_ancestor(repo, inp.build_commit, src) for src in sources):
            change = last_change_of(repo, main, path)
            request = build_request_of(change[1]) if change else None
            by = request.removesuffix("-pins") if request else (f"commit {change[0][:12]}" if change else "someone")
            newest = ", ".join(sorted({s[:12] for s in sources if s}))
            return ConflictVerdict(
                kind="superseded", main_commit=main, superseded_by=by,
                detail=f"main ({main[:12]}) already pins images built from {newest}, the same or a newer source "
                       f"than this build's {inp.build_commit[:12]}, recorded by {by}")
        changed = [p for p in changed_paths(repo, inp.base_commit, main) if p != path]
        rules, texts = self._boundary_inputs(repo, main)
        verdict = decide(rules, texts, changed, harbor_moved=False)
        if verdict.needed:
            return ConflictVerdict(
                kind="rebuild", main_commit=main, reasons=verdict.deciding or verdict.reasons,
                detail=f"main moved to {main[:12]} with changes that reach the image: the validated images no "
                       f"longer match main ({'; '.join(verdict.deciding or verdict.reasons)})")
        return self._rebase(inp, repo, main, path)

    def _boundary_inputs(self, repo, sha: str) -> tuple[list[BoundaryRule], dict[str, str]]:
        """The rebuild boundary at ``sha``: the build contract's rules and Dockerfiles, else the configured rules
        (``build.deploy_boundary``) and whatever Dockerfiles are there."""
        try:
            contract = load_contract(self.repos.contract_files(repo, sha), sha, self.config.build)
            rules = [BoundaryRule(glob=r.glob, rebuild=r.rebuild, reaches=r.reaches, source=r.source)
                     for r in contract.deploy_boundary]
        except (ContractError, GitSourceError) as e:
            activity.logger.warning(f"judging main at {sha[:12]} with the configured boundary: {e}")
            rules = [BoundaryRule(glob=r.glob, rebuild=r.rebuild, reaches=r.reaches,
                                  source=f"config:build.deploy_boundary[{i}]")
                     for i, r in enumerate(self.config.build.deploy_boundary)]
        dockerfiles = [p for p in list_files_at(repo, sha, "docker") if p.rsplit("/", 1)[-1].startswith("Dockerfile")]
        return rules, read_files_at(repo, sha, dockerfiles, missing_ok=True)

    def _rebase(self, inp: ConflictInput, repo, main: str, path: str) -> ConflictVerdict:
        dest = self.paths.worktree(f"{inp.request_id}-rebase")
        try:
            wt = create_worktree(repo, main, dest)
        except (DirtyWorktree, DivergedWorktree) as e:
            activity.logger.warning(f"recreating the rebase worktree: {e}")
            shutil.rmtree(dest, ignore_errors=True)
            wt = create_worktree(repo, main, dest)
        reset_worktree(wt, main)
        author = f"{self.config.repos.git_author_name} <{self.config.repos.git_author_email}>"
        when = git.Repo(wt).commit(main).committed_date
        if inp.build_commit != inp.base_commit:  # the build's own change (Harbor re-pin) first, as it was
            conflicts = replay_commit(wt, inp.build_commit)
            if conflicts:
                return ConflictVerdict(
                    kind="foreign_conflict", main_commit=main, reasons=conflicts,
                    detail=f"the build commit {inp.build_commit[:12]} conflicts with main ({main[:12]}) in "
                           f"{', '.join(conflicts)}: files the service does not own")
            message = git.Repo(wt).commit(inp.build_commit).message.split("\n\nBuild-Request:")[0]
            commit_build_change(wt, message=message, request_id=inp.request_id, author=author,
                                date=f"{when + 1} +0000")
        table = wt / path
        try:
            entries = [PinEntry(architecture=t.architecture, variant=t.variant, digest=t.digest, tag=t.tag,
                                source_commit=inp.build_commit, harbor_commit=inp.harbor_commit)
                       for t in inp.targets if t.status == "validated" and t.digest]
            table.write_text(update_pin_table(table.read_text(), entries, path=path))
        except (FileNotFoundError, PinTableError) as e:
            reset_worktree(wt, main)
            return ConflictVerdict(kind="foreign_conflict", main_commit=main, reasons=[path],
                                   detail=f"the pin table cannot be written on main ({main[:12]}): {e}")
        result = commit_build_change(
            wt, message=f"Pin GPU-RL images built from {inp.build_commit[:12]}\n\nValidated digests for "
                        f"{', '.join(e.architecture + '-' + e.variant for e in entries)}; Harbor {inp.harbor_commit}; "
                        f"written again on {main[:12]}.",
            request_id=f"{inp.request_id}-pins", author=author, date=f"{when + 2} +0000")
        push_branch(wt, self.config.repos.marinskyrl_url, inp.branch, result.sha, lease_on=inp.pin_commit,
                    credential=self.repos.git_credential)
        return ConflictVerdict(
            kind="rebased", main_commit=main, pin_commit=result.sha,
            detail=f"main moved to {main[:12]} with no change that reaches the image; the pin commit was written "
                   f"again on it ({result.sha[:12]}) and pushed: checks run again and a new approval is needed")
