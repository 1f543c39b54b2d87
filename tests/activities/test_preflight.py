"""Preflight on real parts (GitHub stand-in, token registry, Iris controller, git remotes): one test per
credential and tool. Each failure names what is missing and its configuration key, and nothing is
pushed, submitted or opened — by the activity, and (last test) by a whole pipeline run on a worker."""

from __future__ import annotations

import json
import logging
import socket
import subprocess
from pathlib import Path

import pytest
from temporalio.client import WorkflowFailureError
from temporalio.exceptions import ApplicationError
from temporalio.testing import ActivityEnvironment

from activities.preflight import PreflightActivities
from clients.github import GitHubClient
from clients.iris import IrisClient
from domain.buildset import BuildRequest, CompatibilityRequest, plan_targets
from domain.config import CredentialSource, GitHubAppSettings, ServiceConfig
from domain.models import PreflightInput, PreflightReport
from sandbox.git_remotes import commit_to_remote
from sandbox.stack import MARINSKYRL_SLUG
from tests.contract.helpers import contract, fixture_files
from tests.e2e.helpers import git_show, report, request, start_pipeline
from tests.github.test_identities import rsa_key_pair
from worker import build_worker

pytestmark = pytest.mark.stack
SCRIPT = "docker/build_gpu_rl_kaniko.sh"
KUBECTL_STANDIN = Path(__file__).resolve().parents[1] / "standins" / "kubectl_standin"


def _targets(s, head: str):
    req = BuildRequest(architectures=["amd64"], variants=["standard"], clusters={"amd64": "sandbox-amd64"},
                       compatibility_request=CompatibilityRequest(requested_by="t", reason="preflight test"))
    return plan_targets(contract(fixture_files(s.remotes.harbor_pinned), commit=head), req, build_commit=head,
                        harbor_commit=s.remotes.harbor_pinned, cluster_archs=None,
                        image_repository_override=s.config.registry.image_repository)


def _input(s, *, issue_url: str | None = "https://github.com/marin-community/MarinSkyRL/issues/12") -> PreflightInput:
    head = s.remotes.marinskyrl_head
    return PreflightInput(request_id="preflight-test", base_commit=head, build_commit=head, changed_files=[],
                          targets=_targets(s, head), issue_url=issue_url)


def _with(config: ServiceConfig, section: str, **changes) -> ServiceConfig:
    return config.model_copy(update={section: getattr(config, section).model_copy(update=changes)})


def _cluster(config: ServiceConfig, **changes) -> ServiceConfig:
    clusters = dict(config.clusters)
    clusters["sandbox-amd64"] = clusters["sandbox-amd64"].model_copy(update=changes)
    return config.model_copy(update={"clusters": clusters})


async def _run(config: ServiceConfig, inp: PreflightInput) -> PreflightReport:
    return await ActivityEnvironment().run(PreflightActivities(config).preflight, inp)


async def _refused(config: ServiceConfig, inp: PreflightInput, *, retryable: bool = False) -> tuple[str, PreflightReport]:
    with pytest.raises(ApplicationError) as info:
        await _run(config, inp)
    err = info.value
    assert err.type == ("PreflightUnavailable" if retryable else "PreflightFailed") and err.non_retryable != retryable
    assert "nothing was pushed, submitted or opened" in err.message
    return err.message, PreflightReport.model_validate(err.details[0])


def _branches(s) -> list[str]:
    return subprocess.run(["git", "--git-dir", s.remotes.marinskyrl_url.removeprefix("file://"), "for-each-ref",
                           "--format=%(refname)"], capture_output=True, text=True, check=True).stdout.split()


async def _side_effects(s) -> tuple:
    """What a build would leave: remote refs, Iris jobs of this service, PRs and issue comments."""
    async with IrisClient(s.iris.url, client_revision_date=s.config.clusters["sandbox-amd64"].client_revision_date) as iris:
        jobs = sorted(j.job_id for j in await iris.list_jobs(prefix="/gpu-rl-builder/"))
    async with GitHubClient(s.github.api_url, s.github.token, MARINSKYRL_SLUG) as gh:
        pulls = await gh._paged(f"/repos/{MARINSKYRL_SLUG}/pulls", {"state": "all"})
        comments = await gh.list_issue_comments(12)
    return _branches(s), jobs, len(pulls), len(comments)


def _secret_file(s, name: str, value: str) -> CredentialSource:
    path = s.state_dir / "secrets" / name
    path.write_text(value)
    return CredentialSource(kind="file", path=str(path))


async def test_everything_proven_reports_fingerprints_only(service_config):
    s = service_config
    before = await _side_effects(s)
    report = await _run(_cluster(s.config, kubeconfig=str(s.config_path), kubectl=str(KUBECTL_STANDIN)), _input(s))
    assert report.failed == []
    by_key = {(c.name, c.config_key): c for c in report.checks}
    assert by_key[("credential", "registry.token")].fingerprint.startswith("sha256:")
    assert by_key[("credential", "github.token")].fingerprint.startswith("sha256:")
    for name in ("tool git", "git push access", "github push permission", "github issue comment", "registry push",
                 "iris controller", "build script", "tool kubectl"):
        assert any(c.name == name and c.ok for c in report.checks), name
    text = report.model_dump_json()
    assert s.token_registry.push_token not in text and s.github.token not in text
    assert await _side_effects(s) == before


@pytest.mark.parametrize("key", ["registry.token", "github.token"])
async def test_a_credential_that_cannot_be_fetched_is_named(service_config, key):
    s = service_config
    missing = CredentialSource(kind="file", path=str(s.state_dir / "secrets" / "absent"))
    section, field = key.split(".")
    before = await _side_effects(s)
    message, report = await _refused(_with(s.config, section, **{field: missing}), _input(s))
    assert f"credential ({key})" in message and "absent" in message
    assert [c.config_key for c in report.failed] == [key]
    assert await _side_effects(s) == before


async def test_a_registry_credential_the_registry_refuses_is_named(service_config):
    s = service_config
    before = await _side_effects(s)
    message, report = await _refused(_with(s.config, "registry", token=_secret_file(s, "wrong-reg", "not-the-token")),
                                     _input(s))
    (failed,) = report.failed
    assert failed.name == "registry push" and "registry.token" in failed.config_key and "refuses a push" in message
    assert "not-the-token" not in message
    assert await _side_effects(s) == before


async def test_a_github_token_github_refuses_is_named(service_config):
    s = service_config
    before = await _side_effects(s)
    message, report = await _refused(_with(s.config, "github", token=_secret_file(s, "wrong-gh", "not-the-gh-token")),
                                     _input(s))
    assert [c.config_key for c in report.failed] == ["github.token"] and "401" in message
    assert "not-the-gh-token" not in message
    assert await _side_effects(s) == before


async def test_a_github_token_without_push_permission_is_named(service_config):
    s = service_config
    s.github.set_permissions(MARINSKYRL_SLUG, admin=False, maintain=False, push=False, triage=False, pull=True)
    before = await _side_effects(s)
    message, report = await _refused(s.config, _input(s))
    (failed,) = report.failed
    assert failed.config_key == "github.token" and "may not push" in message and "permissions: pull" in message
    assert await _side_effects(s) == before


async def test_an_issue_the_token_cannot_comment_on_is_named(service_config):
    s = service_config
    s.github.set_issue(MARINSKYRL_SLUG, 404, missing=True)
    message, report = await _refused(s.config, _input(s, issue_url=f"https://github.com/{MARINSKYRL_SLUG}/issues/404"))
    assert [c.config_key for c in report.failed] == ["request.issue_url"] and "404" in message
    s.github.set_issue(MARINSKYRL_SLUG, 405, locked=True)
    s.github.set_permissions(MARINSKYRL_SLUG, push=False, pull=True)
    message, report = await _refused(s.config, _input(s, issue_url="#405"))
    assert "request.issue_url" in {c.config_key for c in report.failed} and "locked" in message


async def test_a_missing_lint_tool_is_named(service_config):
    s = service_config
    before = await _side_effects(s)
    message, report = await _refused(_with(s.config, "github", lint_command=["no-such-linter-xyz", "check"]),
                                     _input(s))
    assert [c.config_key for c in report.failed] == ["github.lint_command"] and "no-such-linter-xyz" in message
    assert await _side_effects(s) == before


async def test_a_missing_kubectl_is_named_for_its_cluster(service_config):
    s = service_config
    config = _cluster(s.config, kubeconfig=str(s.config_path), kubectl=str(s.state_dir / "no-kubectl"))
    message, report = await _refused(config, _input(s))
    assert [c.config_key for c in report.failed] == ["clusters.sandbox-amd64.kubectl"] and "no-kubectl" in message


async def test_a_missing_git_is_named(service_config, monkeypatch, tmp_path):
    s = service_config
    empty = tmp_path / "empty-bin"
    empty.mkdir()
    monkeypatch.setenv("PATH", str(empty))
    message, report = await _refused(s.config, _input(s))
    assert "tool git (PATH)" in message and "install git" in message


async def test_an_unreachable_iris_controller_is_named_and_retryable(service_config):
    s = service_config
    with socket.socket() as sock:  # a port nobody listens on
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    message, report = await _refused(_cluster(s.config, controller_url=f"http://127.0.0.1:{port}"), _input(s),
                                     retryable=True)
    assert [c.config_key for c in report.failed] == ["clusters.sandbox-amd64"] and "controller" in message


async def test_a_bash_syntax_error_in_a_required_variable_guard_is_refused(service_config):
    s = service_config
    script = git_show(s.remotes.marinskyrl_url, "main", SCRIPT)
    line = next(ln for ln in script.splitlines() if ln.startswith(': "${GITSHA:?'))
    lineno = script.splitlines().index(line) + 1
    head = commit_to_remote(s.remotes.marinskyrl_url, {SCRIPT: script.replace(line, line.removesuffix('}"'), 1)},
                            "break the GITSHA guard")
    inp = _input(s).model_copy(update={"base_commit": head, "build_commit": head})
    before = await _side_effects(s)
    message, report = await _refused(s.config, inp)
    (failed,) = report.failed
    assert failed.config_key == f"{SCRIPT}:{lineno}" and "does not parse as bash" in message and "GITSHA" in message
    assert await _side_effects(s) == before


async def test_a_build_with_a_token_that_cannot_push_stops_before_any_side_effect(service_stack):
    """The whole pipeline on a worker: preflight refuses, so no branch, no Iris job, no PR, no comment."""
    s = service_stack
    s.github.set_permissions(MARINSKYRL_SLUG, push=False, pull=True)
    before = await _side_effects(s)
    handle = await start_pipeline(s, request(issue_url="#12"))
    with pytest.raises(WorkflowFailureError) as failed:
        await handle.result()
    cause = failed.value.cause
    while cause is not None and not (isinstance(cause, ApplicationError) and cause.type == "PreflightFailed"):
        cause = cause.cause
    assert cause is not None, failed.value
    assert "github.token" in cause.message and "may not push" in cause.message
    rep = await report(s.client, handle.id)
    assert rep.failure.error_type == "PreflightFailed" and "github.token" in rep.failure.message
    assert await _side_effects(s) == before
    history = json.dumps((await handle.fetch_history()).to_json_dict())
    assert s.github.token not in history and s.token_registry.push_token not in history


# ---------------------------------------------------------------- identities and scopes (issue #20)

ALL_APP_PERMISSIONS = {"contents": "write", "pull_requests": "write", "issues": "write", "checks": "read",
                       "statuses": "read", "metadata": "read"}


def _app(s, app_id: str, installation_id: int, permissions: dict[str, str]) -> tuple[ServiceConfig, str]:
    """``s.config`` with github.app instead of github.token, and the App's private key."""
    private, public = rsa_key_pair()
    s.github.register_app(app_id, public, installation_id, permissions=permissions)
    app = GitHubAppSettings(app_id=app_id, installation_id=installation_id,
                            private_key=_secret_file(s, f"app-{app_id}.pem", private))
    return _with(s.config, "github", token=None, app=app), private


async def test_the_registry_user_is_read_with_the_registry_token_itself(service_config):
    """registry.user = token_owner: the login comes from GET /user with registry.token — another owner
    than the GitHub token's — and the push grant proves that pair."""
    s = service_config
    s.github.add_token(s.token_registry.push_token, s.token_registry.push_user, scopes=["write:packages"])
    config = _with(s.config, "registry", user=CredentialSource(kind="token_owner"), github_api_url=s.github.api_url)
    report = await _run(config, _input(s))
    by_name = {c.name: c for c in report.checks}
    assert f"registry.token belongs to {s.token_registry.push_user}" in by_name["registry identity"].detail
    assert by_name["github identity"].detail.startswith("classic token of gpu-rl-builder-bot")
    assert s.token_registry.push_user != "gpu-rl-builder-bot" and by_name["registry push"].ok
    # The same token without write:packages is named by the scope it lacks.
    s.github.add_token(s.token_registry.push_token, s.token_registry.push_user, scopes=["read:packages"])
    message, rep = await _refused(config, _input(s))
    (failed,) = rep.failed
    assert failed.config_key == "registry.token" and "lacks the scope write:packages" in message
    assert "X-OAuth-Scopes: read:packages" in message


async def test_a_classic_github_token_without_the_repo_scope_is_named(service_config):
    s = service_config
    token = "ghp_" + "s" * 36
    s.github.add_token(token, "someone", scopes=["read:org", "gist"])
    message, report = await _refused(_with(s.config, "github", token=_secret_file(s, "gh-scopes", token)), _input(s))
    (failed,) = report.failed
    assert failed.name == "github identity" and failed.config_key == "github.token"
    assert "lacks the scope repo" in message and "X-OAuth-Scopes: gist, read:org" in message and token not in message


async def test_a_fine_grained_token_without_checks_read_is_named_by_the_permission(service_config):
    s = service_config
    token = "github_pat_" + "f" * 40
    s.github.add_token(token, "someone", permissions={k: v for k, v in ALL_APP_PERMISSIONS.items() if k != "checks"})
    message, report = await _refused(_with(s.config, "github", token=_secret_file(s, "gh-fg", token)), _input(s))
    (failed,) = report.failed
    assert failed.name == "github check runs" and "grant checks: read" in message
    assert {c.name for c in report.checks if c.ok} >= {"github identity", "github commit statuses",
                                                        "github push permission", "github issue comment"}


async def test_an_app_installation_is_proven_and_a_missing_permission_is_named(service_config):
    s = service_config
    config, private = _app(s, "9001", 31, ALL_APP_PERMISSIONS)
    report = await _run(config, _input(s))
    ident = next(c for c in report.checks if c.name == "github identity")
    assert ident.ok and ident.config_key == "github.app" and "installation 31 of app 9001" in ident.detail
    assert any(c.config_key == "github.app.private_key" and c.fingerprint for c in report.checks)
    config, private = _app(s, "9002", 32, {k: v for k, v in ALL_APP_PERMISSIONS.items() if k != "statuses"})
    message, rep = await _refused(config, _input(s))
    assert [c.name for c in rep.failed] == ["github identity", "github commit statuses"]
    assert "lacks statuses: read" in message and "grant commit statuses: read" in message
    key_lines = [ln for ln in private.splitlines() if not ln.startswith("-----")]
    assert not [ln for ln in key_lines if ln in message or ln in rep.model_dump_json()]


async def test_an_app_build_refused_by_preflight_leaves_no_key_or_token_in_history(service_config, caplog):
    """The whole pipeline on a worker with github.app: the private key, the App's JWT and the minted
    installation token reach neither the history nor the logs (sentinel)."""
    caplog.set_level(logging.DEBUG)
    s = service_config
    config, private = _app(s, "9003", 33, {k: v for k, v in ALL_APP_PERMISSIONS.items() if k != "checks"})
    before = await _side_effects(s)
    async with build_worker(s.client, config, graceful_shutdown_s=5):
        handle = await start_pipeline(s, request(issue_url="#12"))
        with pytest.raises(WorkflowFailureError):
            await handle.result()
        rep = await report(s.client, handle.id)
        history = json.dumps((await handle.fetch_history()).to_json_dict())
    assert rep.failure.error_type == "PreflightFailed" and "grant checks: read" in rep.failure.message
    assert await _side_effects(s) == before
    key_lines = [ln for ln in private.splitlines() if not ln.startswith("-----")]
    seen = history + caplog.text + rep.model_dump_json()
    assert not [ln for ln in key_lines if ln in seen]
    assert "ghs_inst_" not in seen and s.github.token not in seen
