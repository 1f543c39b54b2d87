"""The one error boundary: every exception leaving an activity becomes a Temporal ``ApplicationError``.

Why here (``activities/``): clients stay Temporal-free and raise their own precise errors; the
activity edge is the only place that must speak Temporal's language (retry or stop, after how long,
with which operator message). ``ActivityGroup`` (activities/common.py) applies ``boundary`` to every
activity, so no activity can forget it, and ``workflows/options.py`` builds every retry policy's
non-retryable list from the classes below, so the two cannot drift apart.

Two kinds of failure:
- ``Transient``: retried with backoff (``next_retry_delay`` from ``Retry-After`` / rate-limit headers),
  bounded by the retry policy's ``maximum_attempts`` and the activity's schedule-to-close budget.
- everything else below: stopped at once, with a type an operator can filter on and a message that
  names what failed and the next step.

Messages are redacted, and the original exception is never attached as the cause (its text may carry
a URL with credentials or a response body).
"""

from __future__ import annotations

import errno
import functools
import inspect
import os
import subprocess
from collections.abc import Callable
from datetime import timedelta
from typing import Any, ClassVar

import git
import httpx
from temporalio import activity
from temporalio.exceptions import ApplicationError

from clients import credentials as _credentials
from clients import git_source as _git
from clients import github as _github
from clients import iris as _iris
from clients import registry as _registry
from clients.bundle import BundleError
from clients.evidence import EvidenceError
from clients.kube import KubectlUnavailable
from domain.buildset import BuildSetError
from domain.config import ConfigError
from domain.contract import ContractError
from domain.harbor_manifest import ManifestError as HarborManifestError
from domain.pins import PinTableError
from domain.redact import redact

MAX_RETRY_DELAY = timedelta(minutes=15)  # never trust a header to park a step longer than this


class ActivityFailure(ApplicationError):
    """Base of every failure the boundary raises; ``type`` is the class name, so policies match it."""

    retryable: ClassVar[bool] = False

    def __init__(self, message: str, *details: Any, next_retry_delay: timedelta | None = None) -> None:
        super().__init__(redact(message), *details, type=type(self).__name__, non_retryable=not self.retryable,
                         next_retry_delay=next_retry_delay)


class Transient(ActivityFailure):
    """A dependency is unreachable, overloaded or rate-limiting: retried with backoff, bounded."""

    retryable = True


class InputError(ActivityFailure):
    """Malformed input, contract or configuration: names the file, field or flag to fix."""


class AuthenticationFailed(ActivityFailure):
    """A service refused the credential (401, refused token): fix the configured secret."""


class PermissionDenied(ActivityFailure):
    """The credential works but lacks a permission (403): grant it."""


class NotFound(ActivityFailure):
    """A repository, commit, file, job or package that must exist does not."""


class MissingTool(ActivityFailure):
    """A configured executable (git, uv, gh, kubectl, a lint command) is not installed on the worker."""


class Conflict(ActivityFailure):
    """Remote state disagrees with what this build would write (moved branch, foreign worktree)."""


class NotAuthorized(ActivityFailure):
    """An operator command named someone who is not a configured operator (``[operators]``)."""


class PreflightFailed(ActivityFailure):
    """Preflight found a missing credential, permission, tool or a broken script: nothing was done yet."""


class PreflightUnavailable(Transient):
    """Preflight could not reach a service (and found nothing else wrong): retried a few times."""


NON_RETRYABLE: tuple[type[ActivityFailure], ...] = (
    InputError, AuthenticationFailed, PermissionDenied, NotFound, MissingTool, Conflict, PreflightFailed,
    NotAuthorized)
NON_RETRYABLE_TYPES: list[str] = [c.__name__ for c in NON_RETRYABLE]


def _delay(seconds: float | None) -> timedelta | None:
    if seconds is None:
        return None
    return min(timedelta(seconds=max(1.0, seconds)), MAX_RETRY_DELAY)


def _from_github(e: _github.GitHubError, credential: str = "github.token") -> ActivityFailure:
    """``credential`` is the configuration key GitHub's answer is about: ``github.token`` or, when the
    service mints installation tokens, ``github.app`` (the fix differs: replace a token, or change the
    App's key or permissions)."""
    where = f"GitHub {e.method} {e.path}".strip()
    app = credential == "github.app"
    if isinstance(e, _github.RateLimited):
        return Transient(f"{where}: rate limited; retrying after the limit resets", next_retry_delay=_delay(
            e.wait_seconds()))
    if isinstance(e, _github.GitHubUnavailable) or (e.status or 0) >= 500:
        return Transient(f"{where}: GitHub unreachable or failing ({e.message})")
    if isinstance(e, _github.Unauthorized):
        if app:
            return AuthenticationFailed(f"{where}: 401 {e.message}: the installation token minted for github.app "
                                        "was refused; check github.app.app_id, installation_id and private_key, "
                                        "then re-run")
        return AuthenticationFailed(f"{where}: 401 {e.message}: the token configured as github.token is invalid "
                                    "or expired; replace it, then re-run")
    if isinstance(e, _github.Forbidden):
        if app:
            return PermissionDenied(f"{where}: 403 {e.message}: the GitHub App (github.app) lacks a permission "
                                    "this step needs (contents/pull-requests/issues write, checks read): grant it "
                                    "in the App's settings and accept it on the installation")
        return PermissionDenied(f"{where}: 403 {e.message}: the github.token lacks a permission this step needs "
                                "(contents/pull-requests/issues write on the repository)")
    if isinstance(e, _github.NotFound):
        return NotFound(f"{where}: 404 {e.message}: the repository or resource does not exist, or {credential} "
                        "cannot see it" + (" (is the App installed on that repository?)" if app else ""))
    return InputError(f"{where}: GitHub refused the request ({e.status} {e.message})")


def _from_registry(e: _registry.RegistryError) -> ActivityFailure:
    if isinstance(e, _registry.RateLimited):
        return Transient(f"registry: {e}", next_retry_delay=_delay(e.retry_after))
    if isinstance(e, _registry.RegistryUnavailable | _registry.DigestMismatch):
        return Transient(f"registry: {e}")
    if isinstance(e, _registry.Unauthorized):
        return AuthenticationFailed(f"registry ({e.step}): {e}: check registry.user / registry.token")
    if isinstance(e, _registry.Denied):
        return PermissionDenied(f"registry ({e.step}): {e}: the registry credential lacks access")
    if isinstance(e, _registry.NotFound):
        return NotFound(f"registry: {e}")
    return InputError(f"registry: {e}")


def _from_iris(e: _iris.IrisError) -> ActivityFailure:
    if e.transient or isinstance(e, _iris.Internal):
        return Transient(str(e))
    if isinstance(e, _iris.PermissionDenied):
        return PermissionDenied(f"{e}: the Iris controller refused this client")
    if isinstance(e, _iris.NotFound):
        return NotFound(str(e))
    return InputError(str(e))  # invalid argument, failed precondition (ClientTooOld), already exists


def _from_git(e: _git.GitSourceError) -> ActivityFailure:
    # A remote that answered "no such repository", "bad credential" or "not allowed" is final: retrying
    # for the whole budget only hides the cause. The message names the remote (its credential redacted).
    if isinstance(e, _git.RemoteNotFound):
        return NotFound(f"git: {e}; check repos.*_url in the service configuration")
    if isinstance(e, _git.RemoteAuthFailed):  # its message names the credential git had, and its key
        return AuthenticationFailed(f"git: {e}" if e.credential_note else f"git: {e}; replace the git credential "
                                    "of that remote")
    if isinstance(e, _git.RemotePermissionDenied):
        return PermissionDenied(f"git: {e}; grant the git credential access to that remote")
    if isinstance(e, _git.RefNotFound | _git.PathNotFound):
        return NotFound(f"git: {e}")
    if isinstance(e, _git.MissingPin | _git.NotText):
        return InputError(f"git: {e}")
    if isinstance(e, _git.BranchConflict | _git.WorktreeError | _git.CommitVerificationFailed):
        return Conflict(f"git: {e}")
    return Transient(f"git: {e}")  # network-level: the remote could not be reached, timed out or hung up


def _file_not_found(e: FileNotFoundError) -> ActivityFailure:
    name = e.filename if isinstance(e.filename, str) else None
    if name and os.sep not in name:
        # subprocess names the argv[0] it could not execute: a tool missing from the worker's PATH.
        return MissingTool(f"`{name}` is not installed on this worker (not on PATH); install it or change the "
                           "configured command")
    return NotFound(f"{name or 'a file'} does not exist ({e.strerror or 'no such file'})")


def classify_exception(e: BaseException, *, github_credential: str = "github.token") -> BaseException:
    """The Temporal failure for ``e``: an ``ApplicationError`` passes through unchanged.
    ``github_credential``: the configuration key GitHub's refusals name (``github.app`` when configured)."""
    if isinstance(e, ApplicationError):
        return e
    match e:
        case _github.GitHubError():
            return _from_github(e, github_credential)
        case _registry.RegistryError():
            return _from_registry(e)
        case _iris.IrisError():
            return _from_iris(e)
        case _git.GitSourceError():
            return _from_git(e)
        case git.exc.GitCommandNotFound():
            return MissingTool("`git` is not installed on this worker (not on PATH)")
        case _credentials.CredentialToolMissing():
            return MissingTool(str(e))
        case _credentials.CredentialError():
            return InputError(f"{e} (see the credential's source in the service configuration)")
        case ContractError() | PinTableError() | BundleError() | ConfigError() | BuildSetError() | HarborManifestError():
            return InputError(str(e))
        case KubectlUnavailable():
            return MissingTool(f"{e} (clusters.<name>.kubectl)")
        case EvidenceError():
            return Transient(f"evidence store: {e}")
        case UnicodeDecodeError():
            return InputError(f"a file is not valid UTF-8 text ({e.reason} at byte {e.start}); save it as UTF-8")
        case FileNotFoundError():
            return _file_not_found(e)
        case PermissionError() if e.errno in (errno.EACCES, errno.EPERM):
            return PermissionDenied(f"{e.filename or 'a file'}: permission denied on the worker")
        case subprocess.TimeoutExpired():
            return Transient(f"`{_argv0(e.cmd)}` timed out after {e.timeout:.0f}s")
        case subprocess.CalledProcessError():
            return Transient(f"`{_argv0(e.cmd)}` exited with {e.returncode}")
        case httpx.HTTPError() | ConnectionError() | TimeoutError():
            return Transient(f"{type(e).__name__}: {e}")
    return e  # anything else: Temporal's default (retryable, type = class name), bounded by the policy


def _argv0(cmd: Any) -> str:
    if isinstance(cmd, list | tuple) and cmd:
        return str(cmd[0])
    return str(cmd).split(" ", 1)[0]


def _github_credential(args: tuple) -> str:
    """The GitHub key of the activity group's configuration (``args[0]`` is the group for methods)."""
    gh = getattr(getattr(args[0], "config", None), "github", None) if args else None
    return "github.app" if getattr(gh, "app", None) is not None else "github.token"


def boundary(fn: Callable) -> Callable:
    """Wrap an async activity so every exception leaves it classified (see ``classify_exception``)."""
    if not inspect.iscoroutinefunction(fn):
        raise TypeError(f"{fn.__qualname__}: only async activities are supported")

    @functools.wraps(fn)
    async def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return await fn(*args, **kwargs)
        except Exception as e:  # noqa: BLE001 - this is the one place that maps them all
            mapped = classify_exception(e, github_credential=_github_credential(args))
            if mapped is e:
                raise
            if activity.in_activity():
                activity.logger.warning(f"{type(e).__name__} → {type(mapped).__name__}: {mapped.message}")
            raise mapped from None

    wrapper.__activity_boundary__ = True  # type: ignore[attr-defined]
    return wrapper
