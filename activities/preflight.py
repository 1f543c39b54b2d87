"""Preflight: prove everything the run will need before its first side effect, in one activity.

Why one activity before ``publish_source``: the build branch push, the Iris job, the registry push
and the PR are side effects; a credential, permission or tool found missing after any of them leaves
something behind and loops on retry. Here every credential is fetched (the value stays in this
process and is discarded; only a sha256 prefix is reported), the GitHub token's permissions and the
issue are read through the API, the registry is asked for a push grant (an upload started and
cancelled), every configured tool is run, every Iris controller must answer and the build script
must parse as bash. Every failure names what is missing and the configuration key that sets it.
Nothing here writes anything anywhere.
"""

from __future__ import annotations

import asyncio
import hashlib
import os
import shutil

from temporalio import activity

from activities.common import ActivityGroup, Heartbeater, iris_client, safe_name
from activities.errors import PreflightFailed, PreflightUnavailable
from clients.credentials import CredentialError, fetch_secret
from clients.git_source import (
    GitSourceError,
    RemoteAuthFailed,
    RemotePermissionDenied,
    check_push_access,
    git_version,
    read_files_at,
)
from clients.github import (
    Forbidden,
    GitHubClient,
    GitHubError,
    GitHubUnavailable,
    NotFound,
    RateLimited,
    ValidationFailed,
)
from clients.github_app import (
    InstallationToken,
    InstallationTokenProvider,
    installation_provider,
    register_private_key,
)
from clients.identity import token_identity
from clients.kube import KubectlUnavailable, kubectl_client_version
from clients.registry import (
    RegistryClient,
    RegistryError,
    RegistryUnavailable,
    scheme_for,
    split_image_repository,
)
from domain.contract.bash_syntax import bash_syntax_errors
from domain.issue_ref import check_issue_host, parse_issue_ref
from domain.models import PreflightCheck, PreflightInput, PreflightReport

# What the build asks of a GitHub App installation (REST permission names): the pin commit and PR branch
# (contents), the PR (pull requests), the issue comment (issues), and the merge gate (checks, statuses).
REQUIRED_APP_PERMISSIONS = {"contents": "write", "pull_requests": "write", "issues": "write",
                            "checks": "read", "statuses": "read"}


def fingerprint(value: str) -> str:
    """A short, non-reversible name for a credential value (to tell two configured values apart)."""
    return "sha256:" + hashlib.sha256(value.encode()).hexdigest()[:12]


class PreflightActivities(ActivityGroup):
    def all(self) -> list:
        return [self.preflight]

    @activity.defn
    async def preflight(self, inp: PreflightInput) -> PreflightReport:
        """Every check runs (one report names every problem); raises when any failed.

        Raises a non-retryable ``PreflightFailed`` for a missing credential, permission, tool or a
        broken script, and a retryable ``PreflightUnavailable`` when the only failures are services
        that did not answer (the workflow bounds those retries)."""
        checks: list[PreflightCheck] = []
        async with Heartbeater():
            secrets = await asyncio.to_thread(self._credentials, checks)
            checks += await asyncio.to_thread(self._tools, inp)
            checks += await self._kubectl(inp)
            has_git = all(c.ok for c in checks if c.name == "tool git")
            if has_git:  # without git, push access and the script cannot be read (already reported)
                checks.append(await asyncio.to_thread(self._git_push, inp))
            checks += await self._github(inp, secrets.get("github.token"))
            checks += await self._registry(inp, secrets.get("registry.user"), secrets.get("registry.token"))
            checks += await self._iris(inp)
            if has_git:
                checks += await asyncio.to_thread(self._scripts, inp)
            secrets.clear()  # the values never leave this activity
        report = PreflightReport(checks=checks)
        failed = report.failed
        if failed:
            activity.logger.warning(report.message())
            transient_only = all(c.transient for c in failed)
            raise (PreflightUnavailable if transient_only else PreflightFailed)(report.message(), report)
        return report

    # ------------------------------------------------------------------ credentials
    def _credentials(self, checks: list[PreflightCheck]) -> dict[str, str]:
        values: dict[str, str] = {}
        for key, source in self.config.credential_sources().items():
            try:
                value = fetch_secret(source, what=key)
            except CredentialError as e:
                checks.append(PreflightCheck(name="credential", config_key=key, ok=False, detail=str(e)))
                continue
            values[key] = value
            if key == "github.app.private_key":
                register_private_key(value)
            checks.append(PreflightCheck(name="credential", config_key=key, ok=True,
                                         detail=f"read from {source.describe()}",
                                         fingerprint=None if source.kind == "literal_public" else fingerprint(value)))
        return values

    # ------------------------------------------------------------------ tools
    def _tools(self, inp: PreflightInput) -> list[PreflightCheck]:
        out: list[PreflightCheck] = []
        try:
            out.append(PreflightCheck(name="tool git", config_key="PATH", ok=True, detail=git_version()))
        except GitSourceError as e:
            out.append(PreflightCheck(name="tool git", config_key="PATH", ok=False,
                                      detail=f"{e}; install git on the worker"))
        gh = self.config.github
        if gh is not None and gh.lint_command:
            exe = gh.lint_command[0]
            found = shutil.which(exe)
            ok = bool(found) and os.access(found, os.X_OK)
            out.append(PreflightCheck(name="tool lint", config_key="github.lint_command", ok=ok,
                                      detail=f"{exe} → {found}" if ok else f"{exe} not found on PATH or not "
                                      "executable on the worker"))
        return out

    async def _kubectl(self, inp: PreflightInput) -> list[PreflightCheck]:
        """kubectl runs for every cluster that needs it (a port-forward, or pod evidence via kubeconfig)."""
        out: list[PreflightCheck] = []
        for name in sorted({t.cluster for t in inp.targets}):
            cluster = self.config.clusters.get(name)
            if cluster is None or not (cluster.kubeconfig or cluster.port_forward):
                continue
            try:
                version = await kubectl_client_version(cluster.kubectl)
                out.append(PreflightCheck(name="tool kubectl", config_key=f"clusters.{name}.kubectl", ok=True,
                                          detail=f"{cluster.kubectl} {version}"))
            except KubectlUnavailable as e:
                out.append(PreflightCheck(name="tool kubectl", config_key=f"clusters.{name}.kubectl", ok=False,
                                          detail=str(e)))
        return out

    def _git_push(self, inp: PreflightInput) -> PreflightCheck:
        url = self.config.repos.marinskyrl_url
        probe = f"{self.config.repos.build_branch_prefix}preflight-{safe_name(inp.request_id)}"
        cred = self.repos.git_credential
        try:
            check_push_access(self.repos.marinskyrl(), url, probe, inp.base_commit, credential=cred)
        except GitSourceError as e:
            # A refused credential names the key that holds it; anything else is about the remote itself.
            key = cred.config_key if isinstance(e, RemoteAuthFailed | RemotePermissionDenied) and cred else \
                "repos.marinskyrl_url"
            return PreflightCheck(name="git push access", config_key=key, ok=False,
                                  detail=f"git cannot push to the repository: {e}")
        return PreflightCheck(name="git push access", config_key="repos.marinskyrl_url", ok=True,
                              detail="git push --dry-run accepted")

    # ------------------------------------------------------------------ GitHub
    async def _github(self, inp: PreflightInput, token: str | None) -> list[PreflightCheck]:
        """Whose token it is and what it may do: the push permission, a classic token's scopes
        (``X-OAuth-Scopes``), an installation's granted permissions, and read probes of the endpoints
        the build needs (check runs, commit statuses, the issue) for tokens that list no scopes."""
        gh = self.config.github
        if gh is None:
            return [PreflightCheck(name="github", config_key="github", ok=False,
                                   detail="no [github] section: the PR with the validated digests cannot be opened")]
        key = "github.app" if gh.app is not None else "github.token"
        out: list[PreflightCheck] = []
        auth: str | InstallationTokenProvider
        try:
            if gh.app is not None:
                auth = installation_provider(gh.api_url, gh.app)
                out.append(self._installation_check(gh.app, await asyncio.to_thread(auth.current)))
            elif token is None:
                return []  # already reported as a missing credential
            else:
                auth = token
                out.append(await asyncio.to_thread(self._github_identity, gh.api_url, token))
        except (GitHubUnavailable, RateLimited) as e:
            return [PreflightCheck(name="github", config_key="github.api_url", ok=False, transient=True,
                                   detail=f"GitHub did not answer: {e}")]
        except (CredentialError, GitHubError) as e:
            transient = isinstance(e, GitHubError) and (e.status or 0) >= 500
            return [PreflightCheck(name="github identity", config_key=key, ok=False, transient=transient,
                                   detail=str(e))]
        slug = self.config.repos.marinskyrl_slug
        async with GitHubClient(gh.api_url, auth, slug) as client:
            try:
                perms = await client.repo_permissions()
                can_push = perms.get("push") or perms.get("maintain") or perms.get("admin")
                out.append(PreflightCheck(
                    name="github push permission", config_key=key, ok=bool(can_push),
                    detail=f"the token may push to {slug} and open PRs" if can_push else
                    f"the token may not push to {slug} (permissions: "
                    f"{', '.join(k for k, v in perms.items() if v) or 'none'}); use a token with write access"))
                out += await self._probes(client, inp, key, slug)
                if inp.issue_url:
                    check_issue_host(inp.issue_url, gh.api_url, gh.web_url)  # the token goes to github.api_url only
                    repo, number = parse_issue_ref(inp.issue_url).in_repo(slug)
                    issue = await client.for_repo(repo).issue(number)
                    ok = not issue["locked"] or (repo.lower() == slug.lower() and bool(can_push))
                    out.append(PreflightCheck(name="github issue comment", config_key="request.issue_url", ok=ok,
                                              detail=f"issue #{number} of {repo} accepts comments" if ok else
                                              f"issue #{number} of {repo} is locked to collaborators"))
            except (GitHubUnavailable, RateLimited) as e:
                out.append(PreflightCheck(name="github", config_key="github.api_url", ok=False, transient=True,
                                          detail=f"GitHub did not answer: {e}"))
            except Forbidden as e:
                what = ("issues: write on the issue's repository" if "/issues/" in (e.path or "")
                        else f"metadata: read on {slug}")
                out.append(PreflightCheck(name="github permission", config_key=key, ok=False,
                                          detail=f"GitHub refused {e.method} {e.path} (403 {e.message}): grant {what}"))
            except ValueError as e:  # an --issue-url on another host
                out.append(PreflightCheck(name="github issue comment", config_key="request.issue_url", ok=False,
                                          detail=str(e)))
            except GitHubError as e:
                ref, what = ("request.issue_url", "issue") if "/issues/" in (e.path or "") else (key, slug)
                out.append(PreflightCheck(name="github access", config_key=ref, ok=False,
                                          detail=f"GitHub refused {what}: HTTP {e.status} {e}"))
        return out

    @staticmethod
    def _github_identity(api_url: str, token: str) -> PreflightCheck:
        ident = token_identity(api_url, token, what="github.token")
        if ident.kind == "installation":
            return PreflightCheck(name="github identity", config_key="github.token", ok=True,
                                  detail="an App installation token (no user; GET /user refused): its permissions "
                                  "are probed below; prefer github.app so it is minted and refreshed here")
        if ident.lacks("repo", "public_repo"):
            return PreflightCheck(name="github identity", config_key="github.token", ok=False,
                                  detail=f"the classic token of {ident.login} lacks the scope repo (contents, pull "
                                  f"requests, issues, statuses); X-OAuth-Scopes: {', '.join(sorted(ident.scopes or ())) or 'none'}")
        return PreflightCheck(name="github identity", config_key="github.token", ok=True,
                              detail=f"{ident.kind} token of {ident.login}"
                              + (f" (scopes: {', '.join(sorted(ident.scopes))})" if ident.scopes is not None else
                                 "; its permissions are probed below"))

    @staticmethod
    def _installation_check(app, minted: InstallationToken) -> PreflightCheck:
        granted = minted.permissions
        missing = [f"{name}: {level}" for name, level in REQUIRED_APP_PERMISSIONS.items()
                   if granted.get(name) not in (("write", "admin") if level == "write" else ("read", "write", "admin"))]
        shown = ", ".join(f"{k}: {v}" for k, v in sorted(granted.items())) or "none"
        if missing:
            return PreflightCheck(name="github identity", config_key="github.app", ok=False,
                                  detail=f"installation {app.installation_id} of app {app.app_id} lacks "
                                  f"{', '.join(missing)} (granted: {shown}); add them to the App and accept them "
                                  "on the installation")
        return PreflightCheck(name="github identity", config_key="github.app", ok=True,
                              detail=f"installation {app.installation_id} of app {app.app_id}: a token valid until "
                              f"{minted.expires_at:%Y-%m-%d %H:%M} UTC (granted: {shown})")

    async def _probes(self, client: GitHubClient, inp: PreflightInput, key: str, slug: str) -> list[PreflightCheck]:
        """Read the check runs and commit statuses of the base commit: a fine-grained or installation
        token without checks/statuses read is refused here (403), not after the build."""
        out: list[PreflightCheck] = []
        for name, permission, probe in (("check runs", "checks: read", client.check_runs),
                                        ("commit statuses", "commit statuses: read", client.combined_status)):
            try:
                await probe(inp.base_commit)
            except Forbidden as e:
                out.append(PreflightCheck(name=f"github {name}", config_key=key, ok=False,
                                          detail=f"the token may not read {name} of {slug} (403 {e.message}): "
                                          f"grant {permission}"))
                continue
            except (NotFound, ValidationFailed):
                pass  # the base commit is not on GitHub yet (404, or GitHub's 422 "No commit found for SHA"):
                # nothing to read, nothing refused
            out.append(PreflightCheck(name=f"github {name}", config_key=key, ok=True,
                                      detail=f"the token may read {name} of {slug}"))
        return out

    # ------------------------------------------------------------------ registry
    async def _registry(self, inp: PreflightInput, user: str | None, token: str | None) -> list[PreflightCheck]:
        if token is None or (user is None and self.config.registry.user.kind != "token_owner"):
            return []  # already reported as a missing credential
        out: list[PreflightCheck] = []
        if self.config.registry.user.kind == "token_owner":
            api = self.config.registry_user_api_url()
            try:
                ident = await asyncio.to_thread(token_identity, api, token, what="registry.token")
            except (GitHubUnavailable, RateLimited, GitHubError) as e:
                return [PreflightCheck(name="registry identity", config_key="registry.user", ok=False, transient=True,
                                       detail=f"GitHub did not say who owns registry.token: {e}")]
            except CredentialError as e:
                return [PreflightCheck(name="registry identity", config_key="registry.token", ok=False, detail=str(e))]
            if ident.login is None:
                return [PreflightCheck(name="registry identity", config_key="registry.user", ok=False,
                                       detail="registry.token is an App installation token, which has no user; set "
                                       "registry.user explicitly")]
            user = ident.login
            if ident.lacks("write:packages"):
                out.append(PreflightCheck(name="registry identity", config_key="registry.token", ok=False,
                                          detail=f"the classic token of {user} lacks the scope write:packages (image "
                                          f"pushes); X-OAuth-Scopes: {', '.join(sorted(ident.scopes or ())) or 'none'}"))
            else:
                out.append(PreflightCheck(name="registry identity", config_key="registry.user", ok=True,
                                          detail=f"registry.token belongs to {user} (GET {api}/user with that token)"))
        assert user is not None
        for image_repository in sorted({t.image_repository for t in inp.targets}):
            key = "registry.token"
            try:
                host, repo = split_image_repository(image_repository)
                bound = self.config.registry.image_repository.partition("/")[0]
                if host.lower() != bound.lower():  # the plan refuses this already; never send the token there
                    raise ValueError(f"the registry credential is bound to {bound} "
                                     "(config:registry.image_repository), not sent to " + host)
                scheme = scheme_for(host, tuple(self.config.registry.insecure_hosts))
                async with RegistryClient(host, scheme=scheme, credentials=(user, token),
                                          trusted_realm_hosts=tuple(self.config.registry.token_realm_hosts)) as client:
                    await client.check_push(repo)
                out.append(PreflightCheck(name="registry push", config_key=key, ok=True,
                                          detail=f"{image_repository} accepts a push with the configured credential"))
            except RegistryUnavailable as e:
                out.append(PreflightCheck(name="registry push", config_key="registry.image_repository", ok=False,
                                          transient=True, detail=f"{image_repository} did not answer: {e}"))
            except (RegistryError, ValueError) as e:
                out.append(PreflightCheck(name="registry push", config_key=f"{key} / registry.user", ok=False,
                                          detail=f"{image_repository} refuses a push with the configured "
                                          f"credential: {e}"))
        return out

    # ------------------------------------------------------------------ Iris
    async def _iris(self, inp: PreflightInput) -> list[PreflightCheck]:
        out: list[PreflightCheck] = []
        for name in sorted({t.cluster for t in inp.targets}):
            key = f"clusters.{name}"
            try:
                async with iris_client(self.config, name) as iris:
                    healthy = await iris.health()
            except Exception as e:  # noqa: BLE001 - any failure to reach the controller is the finding
                out.append(PreflightCheck(name="iris controller", config_key=key, ok=False, transient=True,
                                          detail=f"cannot reach the controller: {type(e).__name__}: {e}"))
                continue
            out.append(PreflightCheck(name="iris controller", config_key=key, ok=healthy, transient=not healthy,
                                      detail="the controller answers" if healthy else
                                      "the controller did not answer /health"))
        return out

    # ------------------------------------------------------------------ build script
    def _scripts(self, inp: PreflightInput) -> list[PreflightCheck]:
        out: list[PreflightCheck] = []
        for path in sorted({t.job.script_path for t in inp.targets if t.job.script_path}):
            commit = inp.build_commit if path in inp.changed_files else inp.base_commit
            try:
                text = read_files_at(self.repos.marinskyrl(), commit, [path])[path]
            except GitSourceError as e:
                out.append(PreflightCheck(name="build script", config_key=path, ok=False,
                                          detail=f"cannot read at {commit[:12]}: {e}"))
                continue
            errors = bash_syntax_errors(text)
            out.append(PreflightCheck(
                name="build script", config_key=f"{path}:{errors[0][0]}" if errors else path, ok=not errors,
                detail="parses as bash" if not errors else "does not parse as bash: " + "; ".join(
                    f"line {n}: {line[:120]}" for n, line in errors)))
        return out

