"""The one error boundary (activities/errors.py) and the one retry policy (workflows/options.py).

Mapping: every client error becomes retryable-with-delay or non-retryable-with-type. Real activities:
a GitHub 401, a UTF-16 ops doc and a missing tool fail at once with the real cause (and keep failing
with it on a retry, never with a misleading follow-on error); the pin commit is the same sha from an
empty work directory, so a retry on another worker pushes nothing new.
"""

from __future__ import annotations

import ast
import shutil
import subprocess
from datetime import timedelta
from pathlib import Path

import httpx
import pytest
from temporalio.exceptions import ApplicationError
from temporalio.testing import ActivityEnvironment

import worker
from activities import errors
from activities.record import RecordActivities
from activities.source import SourceActivities
from clients import git_source, github, iris, registry
from clients.bundle import BundleTooLarge
from clients.credentials import CredentialError, CredentialToolMissing
from clients.evidence import EvidenceError
from clients.kube import KubectlUnavailable
from domain.buildset import BuildSetError
from domain.config import ConfigError, ServiceConfig
from domain.contract import ContractError
from domain.models import LoadStateInput, WatchInput
from sandbox.git_remotes import _commit_via_clone
from sandbox.github_standin import start_github_standin
from sandbox.stack import MARINSKYRL_SLUG
from tests.activities.test_record_guard import _inp
from tests.fixtures_git import fresh_remotes
from workflows import options

ROOT = Path(__file__).resolve().parents[2]
OPS_DOC = ".agents/ops/gpu-rl-image-build.md"


def _gh(cls, status, **kw):
    return cls("message", status=status, method="GET", path="/repos/o/r", **kw)


# (client error, expected boundary class, expected next_retry_delay or None)
CASES = [
    (_gh(github.Unauthorized, 401), errors.AuthenticationFailed, None),
    (_gh(github.Forbidden, 403), errors.PermissionDenied, None),
    (_gh(github.NotFound, 404), errors.NotFound, None),
    (_gh(github.ValidationFailed, 422), errors.InputError, None),
    (_gh(github.RateLimited, 403, reset_at=None, retry_after=42.0), errors.Transient, timedelta(seconds=42)),
    (_gh(github.GitHubError, 502), errors.Transient, None),
    (github.GitHubUnavailable("ConnectError", method="GET", path="/x"), errors.Transient, None),
    (registry.Unauthorized("refused", status=401), errors.AuthenticationFailed, None),
    (registry.Denied("denied", status=403), errors.PermissionDenied, None),
    (registry.NotFound("MANIFEST_UNKNOWN", status=404), errors.NotFound, None),
    (registry.RateLimited("429", status=429, retry_after=7.0), errors.Transient, timedelta(seconds=7)),
    (registry.RateLimited("429", status=429, retry_after=86400.0), errors.Transient, errors.MAX_RETRY_DELAY),
    (registry.RegistryUnavailable("503"), errors.Transient, None),
    (registry.ProtocolError("bad realm"), errors.InputError, None),
    (iris.Unavailable("GetJobStatus", "transport", "cannot reach controller"), errors.Transient, None),
    (iris.ResourceExhausted("LaunchJob", "resource_exhausted", "busy"), errors.Transient, None),
    (iris.PermissionDenied("LaunchJob", "permission_denied", "no"), errors.PermissionDenied, None),
    (iris.NotFound("GetJobStatus", "not_found", "gone"), errors.NotFound, None),
    (iris.InvalidArgument("LaunchJob", "invalid_argument", "bad"), errors.InputError, None),
    (iris.ClientTooOld("LaunchJob", "failed_precondition", "old", 400, revision_date="2020-01-01",
                       cluster_name="c"), errors.InputError, None),
    (git_source.GitCommandFailed("git fetch failed (128): could not read from remote"), errors.Transient, None),
    (git_source.RefNotFound("no such ref"), errors.NotFound, None),
    (git_source.NotText("x is not UTF-8"), errors.InputError, None),
    (git_source.BranchConflict("b", "1" * 40, "2" * 40), errors.Conflict, None),
    (git_source.DirtyWorktree(Path("/w"), "dirty"), errors.Conflict, None),
    (CredentialError("github.token: environment variable X is not set"), errors.InputError, None),
    (CredentialToolMissing("github.token: command:gh auth token failed: `gh` is not installed"), errors.MissingTool,
     None),
    (ContractError("AGENTS.md", 3, "a list"), errors.InputError, None),
    (ConfigError("cluster 'x' is not configured"), errors.InputError, None),
    (BundleTooLarge(10, 5, [("a", 10)]), errors.InputError, None),
    (UnicodeDecodeError("utf-8", b"\xff", 0, 1, "invalid start byte"), errors.InputError, None),
    (FileNotFoundError(2, "No such file or directory", "uv"), errors.MissingTool, None),
    (KubectlUnavailable("kubectl: not found"), errors.MissingTool, None),
    (EvidenceError("s3://bucket/x: unreachable"), errors.Transient, None),
    (BuildSetError("no such variant 'foo'"), errors.InputError, None),
    (FileNotFoundError(2, "No such file or directory", "/etc/missing.toml"), errors.NotFound, None),
    (subprocess.TimeoutExpired(["git", "fetch"], 900), errors.Transient, None),
    (httpx.ConnectError("refused"), errors.Transient, None),
]


@pytest.mark.parametrize(("exc", "expected", "delay"), CASES, ids=lambda v: type(v).__name__)
def test_client_errors_map_to_one_temporal_failure_each(exc, expected, delay):
    mapped = errors.classify_exception(exc)
    assert type(mapped) is expected
    assert mapped.type == expected.__name__
    assert mapped.non_retryable is (not expected.retryable)
    assert mapped.next_retry_delay == delay
    assert mapped.message


def test_every_non_retryable_type_is_a_real_class_the_boundary_raises():
    listed = options.IO_RETRY.non_retryable_error_types
    assert listed and sorted(listed) == sorted(errors.NON_RETRYABLE_TYPES)
    produced = {type(errors.classify_exception(exc)).__name__ for exc, _, _ in CASES} | _raised_in_activities()
    for name in listed:
        cls = getattr(errors, name)
        assert isinstance(cls, type) and issubclass(cls, errors.ActivityFailure) and not cls.retryable
        assert name in produced, f"{name} is listed as non-retryable but nothing raises it"


def _raised_in_activities() -> set[str]:
    """Names that appear in a ``raise`` statement of an activity module (e.g. ``raise PreflightFailed(...)``)."""
    names: set[str] = set()
    for path in (ROOT / "activities").glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Raise) and node.exc is not None:
                names |= {n.id for n in ast.walk(node.exc) if isinstance(n, ast.Name)}
    return names


def test_workflows_define_no_retry_policy_of_their_own():
    """One place for retry policies: no workflow module builds a RetryPolicy or passes retry_policy=."""
    for path in (ROOT / "workflows").glob("*.py"):
        if path.name == "options.py":
            continue
        tree = ast.parse(path.read_text())
        names = {n.id for n in ast.walk(tree) if isinstance(n, ast.Name)}
        kwargs = {k.arg for n in ast.walk(tree) if isinstance(n, ast.Call) for k in n.keywords}
        assert "RetryPolicy" not in names, path
        assert not kwargs & {"retry_policy", "start_to_close_timeout", "heartbeat_timeout"}, path


def test_every_step_has_a_heartbeat_timeout_and_a_bounded_budget():
    steps = {k: v for k, v in vars(options).items() if k.isupper() and isinstance(v, dict)}
    steps["watch"] = options.watch_pull_request(300)
    steps["monitor"] = options.monitor_job(50)
    assert len(steps) >= 12
    for name, opts in steps.items():
        assert opts["heartbeat_timeout"] <= timedelta(seconds=20), name
        policy = opts["retry_policy"]
        assert policy.non_retryable_error_types == errors.NON_RETRYABLE_TYPES, name
        assert 3 <= policy.maximum_attempts <= 200, name
    # ~30 minutes of backoff: 2+4+8+16+32 s (6 attempts), then one attempt a minute (28 more).
    assert options.IO_RETRY.maximum_attempts == options.attempts_within(timedelta(minutes=30)) == 34


def test_every_worker_activity_runs_behind_the_boundary(tmp_path):
    config = ServiceConfig.model_validate({
        "work_dir": str(tmp_path), "repos": {"marinskyrl_url": "file:///x", "harbor_url": "file:///y"},
        "clusters": {}, "registry": {"image_repository": "127.0.0.1:5000/gpu-rl", "user": {"kind": "env", "name": "U"}, "token": {"kind": "env", "name": "T"}}})
    acts = worker.activities_for(config)
    assert len(acts) >= 15
    for a in acts:
        assert getattr(a, "__activity_boundary__", False), a


async def test_unmapped_application_errors_pass_through_unchanged():
    e = ApplicationError("already decided", type="TargetFailed", non_retryable=True)
    assert errors.classify_exception(e) is e


# ---------------------------------------------------------------- real activities, real services
def _config(tmp_path: Path, remotes, *, work: str = "work", token: dict | None = None,
            **github_settings) -> ServiceConfig:
    return ServiceConfig.model_validate({
        "work_dir": str(tmp_path / work),
        "repos": {"marinskyrl_url": remotes.marinskyrl_url, "harbor_url": remotes.harbor_url},
        "clusters": {},
        "registry": {"image_repository": "127.0.0.1:5000/gpu-rl", "user": {"kind": "literal_public", "value": "u"}, "token": {"kind": "env", "name": "GRB_T"}},
        "github": {"token": token or {"kind": "env", "name": "GRB_T"}, **github_settings},
    })


async def _fails_with(fn, *args) -> ApplicationError:
    with pytest.raises(ApplicationError) as info:
        await ActivityEnvironment().run(fn, *args)
    return info.value


async def test_github_401_fails_at_once_as_authentication_failed(tmp_path, monkeypatch):
    remotes = fresh_remotes(tmp_path / "remotes")
    gh = start_github_standin(tmp_path / "gh", {MARINSKYRL_SLUG: remotes.marinskyrl_url.removeprefix("file://")})
    try:
        monkeypatch.setenv("GRB_T", "ghp_" + "w" * 36)  # not the stand-in's token
        acts = RecordActivities(_config(tmp_path, remotes, api_url=gh.api_url))
        err = await _fails_with(acts.watch_pull_request, WatchInput(pr_number=1, last=None, return_after_s=1))
    finally:
        gh.stop()
    assert err.type == "AuthenticationFailed" and err.non_retryable
    assert "401" in err.message and "github.token" in err.message
    assert "w" * 36 not in err.message


async def test_utf16_ops_doc_fails_at_once_naming_the_file(tmp_path):
    remotes = fresh_remotes(tmp_path / "remotes")

    def save_as_utf16(work: Path) -> None:
        (work / OPS_DOC).write_bytes((work / OPS_DOC).read_text().encode("utf-16"))

    sha = _commit_via_clone(remotes.marinskyrl_url, "ops doc saved as UTF-16", "main", save_as_utf16)
    acts = SourceActivities(_config(tmp_path, remotes))
    err = await _fails_with(acts.load_build_state, LoadStateInput(request_id="utf16", source_commit=sha,
                                                                  harbor_ref="main"))
    assert err.type == "InputError" and err.non_retryable
    assert OPS_DOC in err.message and "UTF-8" in err.message


def _path_without(tmp_path: Path, *tools: str) -> str:
    """A PATH holding git (and python) but none of ``tools``."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    for name in ("git", "python3"):
        real = shutil.which(name)
        if real and name not in tools:
            (bin_dir / name).symlink_to(real)
    return str(bin_dir)


async def test_missing_lint_tool_fails_at_once_and_a_retry_names_the_same_cause(tmp_path, monkeypatch):
    remotes = fresh_remotes(tmp_path / "remotes")
    monkeypatch.setenv("GRB_T", "ghp_" + "t" * 36)
    monkeypatch.setenv("PATH", _path_without(tmp_path, "uv"))
    acts = RecordActivities(_config(tmp_path, remotes, api_url="http://127.0.0.1:9",
                                    lint_command=["uv", "run", "python", "infra/pre-commit.py"]))
    inp = _inp(remotes)
    first = await _fails_with(acts.record_artifact, inp)
    second = await _fails_with(acts.record_artifact, inp)  # the same work dir, left as the first attempt left it
    for err in (first, second):
        assert err.type == "MissingTool" and err.non_retryable, err
        assert "`uv` is not installed" in err.message
    assert not _branch_exists(remotes, inp.source.branch)  # nothing pushed


async def test_pin_commit_is_the_same_sha_from_an_empty_work_directory(tmp_path, monkeypatch):
    remotes = fresh_remotes(tmp_path / "remotes")
    inp = _inp(remotes)
    first = RecordActivities(_config(tmp_path, remotes, work="worker-a"))
    sha, _ = first._commit_pins(inp, first.config.github)
    second = RecordActivities(_config(tmp_path, remotes, work="worker-b"))  # another worker, empty work dir
    again, _ = second._commit_pins(inp, second.config.github)  # pushes nothing: the branch already has it
    assert again == sha
    assert _remote_sha(remotes, inp.source.branch) == sha


def _remote_sha(remotes, branch: str) -> str | None:
    out = subprocess.run(["git", "--git-dir", remotes.marinskyrl_url.removeprefix("file://"), "rev-parse", "--verify",
                          "--quiet", f"refs/heads/{branch}"], capture_output=True, text=True).stdout.strip()
    return out or None


def _branch_exists(remotes, branch: str) -> bool:
    return _remote_sha(remotes, branch) is not None


async def test_missing_gh_for_the_github_token_fails_at_once_as_missing_tool(tmp_path, monkeypatch):
    remotes = fresh_remotes(tmp_path / "remotes")
    monkeypatch.setenv("PATH", _path_without(tmp_path, "gh"))
    acts = RecordActivities(_config(tmp_path, remotes, token={"kind": "command", "argv": ["gh", "auth", "token"]}))
    err = await _fails_with(acts.watch_pull_request, WatchInput(pr_number=1, last=None, return_after_s=1))
    assert err.type == "MissingTool" and err.non_retryable
    assert "`gh` is not installed" in err.message and "github.token" in err.message


def test_every_final_boundary_failure_has_a_failure_class_and_next_step():
    """What the pipeline records when a step ends with one of the boundary's final errors (domain/outcome.py)."""
    from domain import outcome
    from domain.buildset import BuildRequest, CompatibilityRequest

    req = BuildRequest(architectures=["amd64"], variants=["standard"],
                       compatibility_request=CompatibilityRequest(requested_by="t", reason="r"))
    typed = {c.__name__ for c in errors.NON_RETRYABLE} - outcome.INPUT_ERROR_TYPES
    # Transient and PreflightUnavailable (a Transient) reach the pipeline only once their retry budget ran out.
    exhausted = {"Transient", "PreflightUnavailable"}
    assert typed | exhausted == set(outcome.BOUNDARY_FAILURES)
    for name in typed | exhausted:
        f = outcome.step_failure(name, "GitHub GET /repos/o/r: 401 Bad credentials", step="recording", request=req)
        assert f.failure_class not in ("internal", "input") and f.error_type == name
        assert f.message.startswith("recording: ") and "starter.py build" in f.next_step


@pytest.mark.parametrize(("exc", "fix"), [
    (github.Unauthorized("Bad credentials", status=401, method="GET", path="/repos/o/r"), "github.app.app_id"),
    (github.Forbidden("Resource not accessible by integration", status=403, method="POST", path="/repos/o/r/pulls"),
     "App's settings"),
    (github.NotFound("Not Found", status=404, method="GET", path="/repos/o/r"), "App installed"),
])
async def test_github_refusals_name_the_app_when_the_service_uses_one(exc, fix):
    """With ``github.app`` configured there is no ``github.token`` to replace: the refusal names the App."""

    class Group:
        config = type("C", (), {"github": type("G", (), {"app": object()})()})()

    @errors.boundary
    async def step(self):
        raise exc

    with pytest.raises(errors.ActivityFailure) as info:
        await step(Group())
    assert "github.app" in info.value.message and fix in info.value.message
    assert "github.token" not in info.value.message
    assert "github.token" in errors.classify_exception(exc).message  # a token-configured service: the token
