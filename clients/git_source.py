"""Immutable source preparation with real git (GitPython): mirror, read, worktree, repin, commit, push.

Why each step is idempotent: these run as Temporal activities that may be retried after a crash at
any point. A mirror fetch can repeat; a worktree is reused only when it is exactly what an earlier
attempt left behind; a build commit is recognised by its ``Build-Request: <id>`` trailer; a push is a
no-op when the remote branch already points at the commit.

Secrets: git authenticates with the service's own credential (``GitCredential``: github.token or a
GitHub App installation token), handed to each network git command alone through a credential helper
the service provides (clients/git_credential_helper.py) reading an anonymous memfd given only to that
process: never in a URL, argv, environment, ``.git/config`` or any other file, and only to the host
domain/git_credential.py allows. A remote URL may still carry a token of its own: URLs are never written
to disk by this module (mirrors fetch by explicit URL, no ``origin`` pointing at the remote, no
FETCH_HEAD) and every error text is passed through :func:`redact_url`.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import re
import shlex
import shutil
import sys
import tempfile
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlsplit

import git
import git.cmd
import git.index.fun
import gitdb.exc
from pydantic import BaseModel, ConfigDict

from clients import git_credential_helper
from clients.child_env import child_env
from domain.git_credential import credential_refusal, origin_of
from domain.redact import redact, register_secret

TRAILER_KEY = "Build-Request"
MANAGED_CONFIG_KEY = "gpu-rl-builder.managed"
_TRAILER_RE = re.compile(rf"^{TRAILER_KEY}:\s*(\S+)\s*$", re.MULTILINE)
_SHA_RE = re.compile(r"^[0-9a-f]{40}$")
_PIN_VALUE_RE = re.compile(r"^[A-Za-z0-9._+:/@-]+$")


# ------------------------------------------------------------------------ the environment of git
_gitpython_popen = git.cmd.safer_popen
# What the next git process this thread starts is given besides its environment: the credential helper's
# configuration and the memfd holding the token (set by ``_offered`` around exactly one command).
_spawn = threading.local()


@dataclass(frozen=True)
class _Given:
    config: tuple[tuple[str, str], ...]
    fd: int


def _allow_listed_popen(*args, env=None, **kwargs):
    """Every git process GitPython starts (commands and its persistent ``cat-file``) gets the allow-listed
    environment (clients/child_env.py) plus git's own ``GIT_*`` settings. Why wrapping GitPython's one
    spawn point: ``Git.execute`` always starts from a copy of ``os.environ`` and has no option not to.

    A network command that was offered the credential also gets the helper's configuration (as
    ``GIT_CONFIG_*``, after any the caller set) and the memfd, inherited by that process tree alone."""
    base = env or {}
    extra: dict[str, str] = {}
    given: _Given | None = getattr(_spawn, "given", None)
    if given is not None:
        _spawn.given = None  # one process only
        count = int(base["GIT_CONFIG_COUNT"]) if base.get("GIT_CONFIG_COUNT", "").isdigit() else 0
        for i, (key, value) in enumerate(given.config, start=count):
            extra[f"GIT_CONFIG_KEY_{i}"], extra[f"GIT_CONFIG_VALUE_{i}"] = key, value
        extra["GIT_CONFIG_COUNT"] = str(count + len(given.config))
        kwargs["pass_fds"] = (*kwargs.get("pass_fds", ()), given.fd)
    return _gitpython_popen(*args, env=child_env(extra, base=base, allow={k for k in base if k.startswith("GIT_")}),
                            **kwargs)


if getattr(git.cmd.safer_popen, "__name__", "") != "_allow_listed_popen":
    git.cmd.safer_popen = _allow_listed_popen
    git.index.fun.safer_popen = _allow_listed_popen  # commit hooks (we pass --no-verify; still covered)


# ----------------------------------------------------------------------------------------- errors
class GitSourceError(RuntimeError):
    """Base class; messages never contain credentials."""


class GitCommandFailed(GitSourceError):
    pass


class GitPushFailed(GitCommandFailed):
    """A push the remote did not take, with git's own message; the branch did not move (no conflict)."""


class RefNotFound(GitSourceError):
    pass


class RemoteRefused(GitSourceError):
    """A remote answered, and its answer is final: retrying cannot change it (base of the three below).
    ``credential_note``: which credential git was given for that remote (or why none), naming its key."""

    def __init__(self, message: str, remote: str, credential_note: str | None = None):
        super().__init__(message)
        self.remote = remote
        self.credential_note = credential_note


class RemoteNotFound(RemoteRefused):
    """The remote repository does not exist (a wrong URL, or it was deleted)."""


class RemoteAuthFailed(RemoteRefused):
    """The remote refused the credential (or none was given where one is needed)."""


class RemotePermissionDenied(RemoteRefused):
    """The credential is accepted but may not do this (e.g. push to a read-only repository)."""


class PathNotFound(GitSourceError):
    pass


class NotText(GitSourceError):
    """A file that must be text is not UTF-8 (e.g. saved as UTF-16): a permanent input error."""


class WorktreeError(GitSourceError):
    def __init__(self, path: Path, problem: str):
        super().__init__(f"worktree {path}: {problem}")
        self.path = path
        self.problem = problem


class DirtyWorktree(WorktreeError):
    pass


class DivergedWorktree(WorktreeError):
    pass


class UnmanagedWorktree(WorktreeError):
    """``dest`` exists but was not created by this service (e.g. an operator's own checkout)."""


class MissingPin(GitSourceError):
    def __init__(self, dockerfile: str, arg: str):
        super().__init__(f"{dockerfile} has no 'ARG {arg}=<value>' line to repin")
        self.dockerfile = dockerfile
        self.arg = arg


class CommitVerificationFailed(GitSourceError):
    pass


class BranchConflict(GitSourceError):
    def __init__(self, branch: str, remote_sha: str, wanted_sha: str):
        super().__init__(
            f"remote branch {branch} points at {remote_sha}, which is not an ancestor of {wanted_sha}; "
            "refusing to overwrite it"
        )
        self.branch = branch
        self.remote_sha = remote_sha
        self.wanted_sha = wanted_sha


# ----------------------------------------------------------------------------------------- models
class _Model(BaseModel):
    model_config = ConfigDict(frozen=True)


class FetchedRepo(_Model):
    path: Path  # the local bare mirror
    default_branch: str
    head_sha: str


class CommitResult(_Model):
    sha: str
    created: bool


# ----------------------------------------------------------------------------------- credential
@dataclass(frozen=True)
class GitCredential:
    """The service's own credential for git: read at run time, offered only to ``origin``.

    ``token`` is called for each network command that may have it (a file read, a command, or the App
    installation's cached token provider); the value is registered for redaction and written only into
    the memfd of that one command."""

    config_key: str  # github.token | github.app: what a refusal names
    source: str  # where it is read from (never the value)
    origin: str | None  # the only scheme://host[:port] it goes to
    bound_by: str  # the configuration key the origin comes from
    fix: str  # what to do when the remote refuses it
    token: Callable[[], str] = field(repr=False, compare=False)

    def describe(self) -> str:
        return f"config:{self.config_key} ({self.source})"


def _has_userinfo(url: str) -> bool:
    try:
        return urlsplit(url).username is not None
    except ValueError:
        return False


def _helper_command(fd: int, origin: str) -> str:
    """``credential.helper`` value: the helper file run by this interpreter, isolated (``-I -S``: no
    environment variables, user or site packages), no bytecode written (``-B``)."""
    helper = Path(git_credential_helper.__file__).resolve()
    return (f"!{shlex.quote(sys.executable)} -I -S -B {shlex.quote(str(helper))} --fd {fd} "
            f"--origin {shlex.quote(origin)}")


@contextmanager
def _offered(credential: GitCredential | None, remote: str) -> Iterator[str | None]:
    """Offer ``credential`` to the next git process this thread starts, when ``remote`` may have it;
    yields what to say if the remote refuses (which credential git had, or why it had none)."""
    if _has_userinfo(remote):
        yield "git used the credential written in the remote URL (repos.*_url), not the service's"
        return
    if credential is None:
        yield "the service has no git credential (configure [github] token or app)"
        return
    refusal = credential_refusal(remote, credential.origin, bound_by=credential.bound_by)
    if refusal is not None:
        yield f"git was given no credential ({refusal}; config:{credential.config_key})"
        return
    origin = origin_of(remote) or ""
    token = credential.token()
    register_secret(token)
    if not hasattr(os, "memfd_create"):
        raise GitCommandFailed("git's credential needs Linux memfd_create (the worker image's platform)")
    fd = os.memfd_create("gpu-rl-builder-git-credential", os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
    try:
        os.write(fd, token.encode())
        del token
        fcntl.fcntl(fd, fcntl.F_ADD_SEALS,
                    fcntl.F_SEAL_SEAL | fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_GROW | fcntl.F_SEAL_WRITE)
        # Reset first: a helper configured system-wide or in HOME (``store`` writes ~/.git-credentials)
        # is never asked, and never told to store ours.
        _spawn.given = _Given(config=(("credential.helper", ""), ("credential.helper", _helper_command(fd, origin))),
                              fd=fd)
        yield (f"git authenticated to {origin} as {git_credential_helper.USERNAME} with {credential.describe()}, "
               f"which the remote refused: {credential.fix}")
    finally:
        _spawn.given = None
        os.close(fd)


# ---------------------------------------------------------------------------------------- helpers
def redact_url(text: str) -> str:
    """Replace ``user:token@`` in any URL inside ``text`` with ``***@``."""
    return re.sub(r"(?i)([a-z][a-z0-9+.-]*://)[^/@\s]+@", r"\1***@", text)


_NETWORK_COMMANDS = {"fetch", "push", "ls-remote", "clone", "pull"}
# git's own words (and a git host's) for a remote whose answer is final; anything else a network command
# prints (cannot resolve or connect, timeouts, 5xx, a hung-up connection) stays a retryable failure.
_REFUSALS: list[tuple[type[RemoteRefused], re.Pattern[str], str]] = [
    (RemoteNotFound, re.compile(r"does not appear to be a git repository|repository '[^']*' not found|"
                                r"Repository not found|returned error: 404", re.I),
     "does not exist (wrong URL, or the repository was deleted)"),
    (RemoteAuthFailed, re.compile(r"Authentication failed|could not read (Username|Password)|returned error: 401|"
                                  r"terminal prompts disabled|Permission denied \(publickey|Invalid username or "
                                  r"password|Host key verification failed", re.I),
     "refused the credential"),
    (RemotePermissionDenied, re.compile(r"returned error: 403|Permission to \S+ denied|remote: Permission denied|"
                                        r"insufficient permission|not allowed to push", re.I),
     "refused the operation (the credential lacks permission)"),
]


def _remote_arg(args: tuple[str, ...]) -> str:
    """The remote of a network command: its first argument that is not an option."""
    return next((a for a in args[1:] if not a.startswith("-")), "?")


def classify_git_failure(command: str, remote: str, status: object, stderr: str, *,
                         credential_note: str | None = None) -> GitSourceError:
    """A failed git command as the error it means: a final refusal by the remote (typed, naming the
    remote, never its credential), or ``GitCommandFailed`` (network-level or local: retryable).
    ``credential_note`` (which credential git had) is added to a refused credential's message."""
    text = redact_url(f"git {command} failed ({status}): {stderr}")
    if command in _NETWORK_COMMANDS:
        for cls, pattern, meaning in _REFUSALS:
            if pattern.search(stderr):
                where = redact_url(remote)
                note = credential_note if cls is RemoteAuthFailed else None
                return cls(f"git remote {where} {meaning}: {text}" + (f"; {note}" if note else ""), where, note)
    return GitCommandFailed(text)


def _run(repo: git.Repo | git.Git, *args: str, env: dict[str, str] | None = None,
         credential: GitCredential | None = None, **kw) -> str:
    """Run a git command; errors re-raised (credentials redacted) as a remote's final refusal
    (``RemoteRefused``) or ``GitCommandFailed``. A network command (``args[0]``) to a remote ``credential``
    may go to is given it through the helper (``_offered``)."""
    runner = repo.git if isinstance(repo, git.Repo) else repo
    network = args[0] in _NETWORK_COMMANDS
    remote = _remote_arg(args)
    # A credentialed command follows no redirect: git would take the credential's request elsewhere (a
    # plain-http host, say) and then blame the credential for that host's answer.
    guard = ("-c", "http.followRedirects=false") if network and (credential is not None or _has_userinfo(remote)) \
        else ()
    with _offered(credential, remote) if network else _nothing() as note:
        try:
            return runner.execute(["git", *guard, *args], env=env, **kw)
        except git.GitCommandError as exc:
            stderr = exc.stderr.strip() if isinstance(exc.stderr, str) else str(exc.stderr)
            raise classify_git_failure(args[0], remote, exc.status, stderr, credential_note=note) from None


@contextmanager
def _nothing() -> Iterator[None]:
    yield None


def _git_env(extra: dict[str, str] | None) -> dict[str, str]:
    env = {"GIT_TERMINAL_PROMPT": "0", "GIT_ASKPASS": "true"}
    env.update(extra or {})
    return env


@contextmanager
def _locked(lock_path: Path) -> Iterator[None]:
    lock_path.parent.mkdir(parents=True, exist_ok=True)
    with lock_path.open("a") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def _mirror_name(url: str) -> str:
    clean = redact_url(url).replace("***@", "")
    stem = re.sub(r"[^A-Za-z0-9._-]+", "_", clean.rstrip("/").rsplit("/", 1)[-1].removesuffix(".git"))
    return f"{stem or 'repo'}-{hashlib.sha256(clean.encode()).hexdigest()[:12]}.git"


# ----------------------------------------------------------------------------------------- mirror
class MirrorCache:
    """One bare mirror per remote under ``root``, refreshed on every :meth:`fetch`.

    ``credential``: the service's git credential (fetches of private repositories); ``git_env`` more
    environment for network git commands.
    """

    def __init__(self, root: Path, *, git_env: dict[str, str] | None = None,
                 credential: GitCredential | None = None):
        self.root = Path(root)
        self.git_env = git_env
        self.credential = credential

    def mirror_path(self, url: str) -> Path:
        return self.root / _mirror_name(url)

    def fetch(self, url: str) -> FetchedRepo:
        path = self.mirror_path(url)
        env = _git_env(self.git_env)
        with _locked(path.with_suffix(".lock")):
            repo = self._open_or_init(path)
            _run(repo, "fetch", "--prune", "--no-write-fetch-head", "--quiet", url,
                 "+refs/heads/*:refs/heads/*", "+refs/tags/*:refs/tags/*", env=env, credential=self.credential)
            branch = self._remote_default_branch(repo, url, env, self.credential)
            _run(repo, "symbolic-ref", "HEAD", f"refs/heads/{branch}")
            head = _run(repo, "rev-parse", "--verify", f"refs/heads/{branch}^{{commit}}")
        return FetchedRepo(path=path, default_branch=branch, head_sha=head)

    @staticmethod
    def _open_or_init(path: Path) -> git.Repo:
        if path.exists():
            try:
                return git.Repo(path)
            except (git.InvalidGitRepositoryError, git.NoSuchPathError):
                shutil.rmtree(path)  # a half-created mirror from a crashed attempt
        tmp = Path(tempfile.mkdtemp(prefix=f".{path.name}.", dir=path.parent))
        git.Repo.init(tmp, bare=True)
        os.replace(tmp, path)
        return git.Repo(path)

    @staticmethod
    def _remote_default_branch(repo: git.Repo, url: str, env: dict[str, str], credential: GitCredential | None
                               ) -> str:
        out = _run(repo, "ls-remote", "--symref", url, "HEAD", env=env, credential=credential)
        for line in out.splitlines():
            if line.startswith("ref: ") and line.endswith("\tHEAD"):
                return line[len("ref: ") :].split("\t")[0].removeprefix("refs/heads/")
        # No symref advertised: fall back to a single branch, or main/master.
        branches = [r.name for r in repo.heads]
        for candidate in (["main", "master"] if len(branches) != 1 else branches):
            if candidate in branches:
                return candidate
        raise RefNotFound("cannot tell the remote's default branch (no HEAD symref advertised)")


def _repo(fetched: FetchedRepo) -> git.Repo:
    return git.Repo(fetched.path)


def resolve_ref(fetched: FetchedRepo, ref: str | None = None) -> str:
    """Full commit sha for ``ref`` (branch, tag or sha); the default branch head when ``ref`` is None."""
    repo = _repo(fetched)
    candidates = (
        [f"refs/heads/{fetched.default_branch}"] if ref is None
        else [f"refs/heads/{ref}", f"refs/tags/{ref}", ref]
    )
    for candidate in candidates:
        try:
            sha = _run(repo, "rev-parse", "--verify", "--quiet", f"{candidate}^{{commit}}")
        except GitCommandFailed:
            continue
        if _SHA_RE.match(sha):
            return sha
    raise RefNotFound(f"{ref or fetched.default_branch!r} is not a branch, tag or commit of the mirror")


def read_files_at(
    fetched: FetchedRepo, sha: str, paths: list[str], *, missing_ok: bool = False
) -> dict[str, str]:
    """Text of ``paths`` at commit ``sha`` without a worktree; missing paths raise unless missing_ok."""
    out: dict[str, str] = {}
    for path, data in read_blobs_at(fetched, sha, paths, missing_ok=missing_ok).items():
        try:
            out[path] = data.decode("utf-8")
        except UnicodeDecodeError as e:
            raise NotText(f"{path} at {sha} is not UTF-8 text (undecodable byte at offset {e.start})") from None
    return out


def read_blobs_at(
    fetched: FetchedRepo, sha: str, paths: list[str], *, missing_ok: bool = False
) -> dict[str, bytes]:
    """Bytes of ``paths`` at commit ``sha`` (the caller decides how to decode and what to say if it cannot)."""
    try:
        commit = _repo(fetched).commit(sha)
        commit.tree  # noqa: B018 - resolve now: an unknown sha fails here, not half-way through the paths
    except (ValueError, gitdb.exc.BadName, gitdb.exc.BadObject):
        raise RefNotFound(f"commit {sha} is not in the mirror of {fetched.path.name}") from None
    out: dict[str, bytes] = {}
    for path in paths:
        try:
            blob = commit.tree / path
        except KeyError:
            if missing_ok:
                continue
            raise PathNotFound(f"{path} does not exist at {sha}") from None
        if blob.type != "blob":
            raise PathNotFound(f"{path} at {sha} is a {blob.type}, not a file")
        out[path] = blob.data_stream.read()
    return out


def list_files_at(fetched: FetchedRepo, sha: str, prefix: str = "") -> list[str]:
    """Files (recursively) under ``prefix`` at commit ``sha``."""
    args = ["ls-tree", "-r", "-z", "--name-only", sha]
    if prefix:
        args += ["--", prefix]
    out = _run(_repo(fetched), *args)
    return sorted(p for p in out.split("\0") if p)


def changed_paths(fetched: FetchedRepo, old_sha: str, new_sha: str) -> list[str]:
    """Every path added, removed or modified between the commits (renames as both old and new path)."""
    out = _run(_repo(fetched), "diff", "--name-only", "--no-renames", "-z", old_sha, new_sha)
    return sorted(p for p in out.split("\0") if p)


# --------------------------------------------------------------------------------------- worktree
def is_ancestor(fetched: FetchedRepo, old: str, new: str) -> bool:
    """Is ``old`` an ancestor of (or equal to) ``new``?"""
    try:
        _run(_repo(fetched), "merge-base", "--is-ancestor", old, new)
    except GitCommandFailed:
        return False
    return True


def last_change_of(fetched: FetchedRepo, sha: str, path: str) -> tuple[str, str] | None:
    """The latest non-merge commit reachable from ``sha`` that changed ``path``: (sha, message)."""
    out = _run(_repo(fetched), "log", "-1", "--no-merges", "--format=%H%x00%B", sha, "--", path)
    if not out.strip():
        return None
    commit, _, message = out.partition("\0")
    return commit.strip(), message


def replay_commit(worktree: Path, commit: str) -> list[str]:
    """Apply ``commit``'s change on top of the worktree's HEAD, uncommitted (the caller commits it
    reproducibly). Returns the paths that conflict, after putting the worktree back at HEAD."""
    repo = git.Repo(worktree)
    try:
        _run(repo, "cherry-pick", "--no-commit", commit)
        return []
    except GitCommandFailed:
        conflicted = _run(repo, "diff", "--name-only", "--diff-filter=U", "-z")
        _run(repo, "reset", "--quiet", "--hard", "HEAD")
        try:
            _run(repo, "cherry-pick", "--quit")
        except GitCommandFailed:
            pass
        return sorted(p for p in conflicted.split("\0") if p) or ["(git named no file)"]


def create_worktree(fetched: FetchedRepo, base_sha: str, dest: Path) -> Path:
    """A clean clone of the mirror at ``base_sha`` in ``dest`` (detached HEAD), reused when safe.

    Reused when ``dest`` is our clone, clean, and at ``base_sha`` or at our own build commit on top of
    it. Otherwise raises :class:`DirtyWorktree`, :class:`DivergedWorktree` or
    :class:`UnmanagedWorktree`.
    """
    dest = Path(dest)
    if dest.exists() and any(dest.iterdir()):
        _check_reusable(dest, base_sha)
        return dest
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{dest.name}.", dir=dest.parent))
    try:
        repo = git.Repo.clone_from(str(fetched.path), tmp, no_checkout=True)
        _run(repo, "checkout", "--quiet", "--detach", base_sha)
        with repo.config_writer() as cw:
            cw.set_value("gpu-rl-builder", "managed", "true")
        if dest.exists():
            dest.rmdir()
        try:
            os.replace(tmp, dest)
        except OSError:
            if not (dest.exists() and any(dest.iterdir())):
                raise
            _check_reusable(dest, base_sha)  # a concurrent attempt got there first
    finally:
        if tmp.exists():
            shutil.rmtree(tmp)
    return dest


def _check_reusable(dest: Path, base_sha: str) -> None:
    try:
        repo = git.Repo(dest)
    except (git.InvalidGitRepositoryError, git.NoSuchPathError):
        raise UnmanagedWorktree(dest, "exists and is not a git checkout") from None
    if repo.working_tree_dir is None or Path(repo.working_tree_dir).resolve() != dest.resolve():
        raise UnmanagedWorktree(dest, "is inside another checkout, not a clone made by this service")
    with repo.config_reader() as cr:
        managed = cr.get_value("gpu-rl-builder", "managed", default="false")
    if str(managed).lower() != "true":
        raise UnmanagedWorktree(dest, "is a git checkout not created by this service; refusing to touch it")
    dirty = _dirty_paths(repo)
    if dirty:
        raise DirtyWorktree(dest, f"has uncommitted changes: {', '.join(dirty[:10])}")
    head = repo.head.commit
    if head.hexsha == base_sha:
        return
    if len(head.parents) == 1 and head.parents[0].hexsha == base_sha and build_request_of(head.message):
        return
    raise DivergedWorktree(
        dest, f"HEAD is {head.hexsha}, neither base {base_sha} nor a build commit on top of it"
    )


def _dirty_paths(repo: git.Repo) -> list[str]:
    out = _run(repo, "status", "--porcelain=v1", "-z", "--untracked-files=all")
    entries = [e for e in out.split("\0") if e]
    return [e[3:] if len(e) > 3 and e[2] == " " else e for e in entries]


def worktree_changes(worktree: Path) -> list[str]:
    """Paths modified, added or untracked in ``worktree`` (what a commit of it would touch)."""
    return _dirty_paths(git.Repo(worktree))


def restore_paths(worktree: Path, paths: list[str]) -> None:
    """Undo the working-tree changes to ``paths`` (back to HEAD)."""
    _run(git.Repo(worktree), "checkout", "--", *paths)


def diff_names(worktree: Path, old_sha: str, new_sha: str) -> list[str]:
    """Paths that differ between two commits of ``worktree``'s repository."""
    if old_sha == new_sha:
        return []
    return [p for p in _run(git.Repo(worktree), "diff", "--name-only", old_sha, new_sha).splitlines() if p]


def build_request_of(message: str | bytes) -> str | None:
    """The ``Build-Request`` trailer value of a commit message, if any."""
    text = message.decode() if isinstance(message, bytes) else message
    found = _TRAILER_RE.findall(text)
    return found[-1] if found else None


# ------------------------------------------------------------------------------------------ repin
def read_dockerfile_args(dockerfile_text: str) -> dict[str, str]:
    """``ARG NAME=value`` defaults (first declaration wins, quotes stripped), as the pin guard reads them."""
    out: dict[str, str] = {}
    for m in re.finditer(r"^[ \t]*ARG[ \t]+([A-Za-z_][A-Za-z0-9_]*)=(\S*)", dockerfile_text, re.MULTILINE):
        out.setdefault(m.group(1), m.group(2).strip("\"'"))
    return out


def _arg_line_re(name: str) -> re.Pattern[str]:
    return re.compile(
        rf"^(?P<prefix>[ \t]*ARG[ \t]+{re.escape(name)}=)(?P<q>[\"']?)(?P<val>[^\"'\s]*)(?P=q)(?P<rest>[ \t]*(?:#.*)?)$",
        re.MULTILINE,
    )


def repin_dockerfiles(
    worktree: Path,
    dockerfiles: list[str],
    pins: dict[str, str],
    *,
    optional: dict[str, set[str]] | None = None,
) -> list[str]:
    """Rewrite existing ``ARG NAME=value`` lines; returns the Dockerfiles whose text changed.

    Every pin must exist in every Dockerfile, except ARGs listed in ``optional[dockerfile]``. All files
    are checked before any is written, so a missing pin leaves the tree untouched.
    """
    worktree = Path(worktree)
    optional = optional or {}
    for name, value in pins.items():
        if not _PIN_VALUE_RE.match(value):
            raise ValueError(f"pin {name} has an unsafe value {value!r}")
    new_texts: dict[str, str] = {}
    for rel in dockerfiles:
        path = worktree / rel
        if not path.is_file():
            raise PathNotFound(f"Dockerfile {rel} does not exist in {worktree}")
        text = original = path.read_text()
        for name, value in pins.items():
            pattern = _arg_line_re(name)
            if not pattern.search(text):
                if name in optional.get(rel, set()):
                    continue
                raise MissingPin(rel, name)
            text = pattern.sub(lambda m, v=value: f"{m['prefix']}{m['q']}{v}{m['q']}{m['rest']}", text)
        if text != original:
            new_texts[rel] = text
    for rel, text in new_texts.items():
        _atomic_write(worktree / rel, text)
    return [rel for rel in dockerfiles if rel in new_texts]


def _atomic_write(path: Path, text: str) -> None:
    mode = path.stat().st_mode & 0o7777
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    with os.fdopen(fd, "w") as fh:
        fh.write(text)
    os.chmod(tmp, mode)
    os.replace(tmp, path)


# ----------------------------------------------------------------------------------------- commit
def _parse_author(author: str) -> tuple[str, str]:
    m = re.match(r"^\s*(.+?)\s*<([^<>\s]+)>\s*$", author)
    if not m:
        raise ValueError(f"author must look like 'Name <email>', got {author!r}")
    return m.group(1), m.group(2)


def commit_build_change(worktree: Path, *, message: str, request_id: str, author: str,
                        date: str | None = None) -> CommitResult:
    """Commit every change in ``worktree`` with a ``Build-Request: <request_id>`` trailer, idempotently.

    - HEAD already carries this request's trailer and the tree is clean: that commit, created=False.
    - Nothing changed: HEAD (the base commit, which then holds every input), created=False.
    - Otherwise a new commit, created=True.
    Afterwards HEAD must equal the returned sha and ``git diff --quiet`` / ``--cached --quiet`` pass.
    ``date`` (git date format, e.g. ``"1700000000 +0000"``) pins author and committer dates.
    """
    if not re.match(r"^[A-Za-z0-9._:/-]+$", request_id):
        raise ValueError(f"request_id {request_id!r} must be a single token")
    repo = git.Repo(worktree)
    name, email = _parse_author(author)
    _run(repo, "add", "--all")
    staged = _run(repo, "diff", "--cached", "--name-only", "-z", "HEAD")
    head = repo.head.commit
    if not staged:
        result = CommitResult(sha=head.hexsha, created=False)
    else:
        if build_request_of(head.message) == request_id:
            raise DirtyWorktree(
                Path(worktree),
                f"HEAD {head.hexsha} already is the build commit for {request_id} but more changes are "
                f"pending: {', '.join(p for p in staged.split(chr(0)) if p)}",
            )
        env = {
            "GIT_AUTHOR_NAME": name, "GIT_AUTHOR_EMAIL": email,
            "GIT_COMMITTER_NAME": name, "GIT_COMMITTER_EMAIL": email,
        }
        if date:  # a fixed date makes the commit reproducible: same inputs, same sha, on any worker
            env["GIT_AUTHOR_DATE"] = env["GIT_COMMITTER_DATE"] = date
        full_message = f"{message.rstrip()}\n\n{TRAILER_KEY}: {request_id}\n"
        _run(repo, "-c", "commit.gpgsign=false", "commit", "--quiet", "--no-verify", "-m", full_message,
             env=env)
        result = CommitResult(sha=repo.head.commit.hexsha, created=True)
    _verify_committed(repo, result.sha)
    return result


def _verify_committed(repo: git.Repo, sha: str) -> None:
    head = _run(repo, "rev-parse", "HEAD")
    if head != sha:
        raise CommitVerificationFailed(f"HEAD is {head}, expected {sha}")
    for args in (("diff", "--quiet"), ("diff", "--cached", "--quiet")):
        try:
            _run(repo, *args)
        except GitCommandFailed:
            raise CommitVerificationFailed(f"'git {' '.join(args)}' reports changes after commit {sha}") from None
    dirty = _dirty_paths(repo)
    if dirty:
        raise CommitVerificationFailed(f"untracked or modified files remain after commit {sha}: {dirty[:10]}")


# ------------------------------------------------------------------------------------------- push
def remote_branch_sha(worktree: Path, remote_url: str, branch: str, *, git_env: dict[str, str] | None = None,
                      credential: GitCredential | None = None) -> str | None:
    out = _run(git.Repo(worktree), "ls-remote", remote_url, f"refs/heads/{branch}", env=_git_env(git_env),
               credential=credential)
    for line in out.splitlines():
        sha, _, ref = line.partition("\t")
        if ref == f"refs/heads/{branch}":
            return sha
    return None


def push_branch(
    worktree: Path, remote_url: str, branch: str, sha: str, *, git_env: dict[str, str] | None = None,
    keep_own: tuple[str, ...] = (), replace_own: str | None = None, credential: GitCredential | None = None,
    lease_on: str | None = None,
) -> None:
    """Make ``refs/heads/<branch>`` on the remote point at ``sha``; fast-forward only, idempotent.

    ``keep_own``: Build-Request trailers of commits that may already sit on top of ``sha`` (e.g. the
    pin commit an earlier run of the same request pushed); then the branch already holds ``sha`` and
    is left as it is, so a re-run continues from it instead of refusing the branch.

    ``replace_own``: a Build-Request trailer; when the branch's head is a commit with that trailer on
    the same parent as ``sha`` (an earlier run's pin commit with other content, e.g. a digest that has
    changed since), it is replaced with ``--force-with-lease`` on exactly that head: the service's own
    commit on its own branch, never anyone else's (a moved head makes the push fail).

    ``lease_on``: the branch may be replaced while it is at exactly this commit (the service's own pin commit,
    rebased onto a new main); any other head is a BranchConflict."""
    repo = git.Repo(worktree)
    env = _git_env(git_env)
    current = remote_branch_sha(worktree, remote_url, branch, git_env=git_env, credential=credential)
    if current == sha:
        return
    lease: str | None = None
    if current is not None:
        _run(repo, "fetch", "--quiet", "--no-write-fetch-head", remote_url, f"refs/heads/{branch}", env=env,
             credential=credential)  # a failure is git's own (GitCommandFailed or a refusal), not a conflict
        if keep_own and _only_own_commits_on_top(repo, sha, current, keep_own):
            return
        if lease_on is not None and current == lease_on:
            lease = current
        elif replace_own and _own_sibling(repo, current, sha, replace_own):
            lease = current
        else:
            try:
                _run(repo, "merge-base", "--is-ancestor", current, sha)
            except GitCommandFailed:
                raise BranchConflict(branch, current, sha) from None
    force = [f"--force-with-lease=refs/heads/{branch}:{lease}"] if lease else []
    try:
        _run(repo, "push", "--quiet", "--no-verify", *force, remote_url, f"{sha}:refs/heads/{branch}", env=env,
             credential=credential)
    except GitCommandFailed as e:
        after = remote_branch_sha(worktree, remote_url, branch, git_env=git_env, credential=credential)
        if after == sha:
            return  # a concurrent attempt pushed the same commit
        if after != current:  # someone else moved the branch meanwhile: that is a conflict
            raise BranchConflict(branch, after or "(missing)", sha) from None
        # The branch did not move: the push itself failed (a hook, a size limit, the network). git's own
        # words, redacted (classify_git_failure already took any URL credential out).
        raise GitPushFailed(f"git push of {sha[:12]} to {branch} on {redact_url(remote_url)} failed and the "
                            f"branch still points at {current or '(nothing)'}: {redact(str(e))}") from None


# ------------------------------------------------------------------------------------- preflight
def git_version() -> str:
    """``git --version`` (preflight: the tool runs here); raises GitCommandFailed when it cannot."""
    try:
        return _run(git.Git(), "--version")
    except (git.GitCommandNotFound, OSError) as e:
        raise GitCommandFailed(f"git cannot run: {type(e).__name__}") from None


def check_push_access(fetched: FetchedRepo, remote_url: str, probe_ref: str, sha: str, *,
                      git_env: dict[str, str] | None = None, credential: GitCredential | None = None) -> None:
    """Prove the machine's git credentials may push to ``remote_url`` without pushing anything:
    ``git push --dry-run`` of ``sha`` to ``refs/heads/<probe_ref>`` (a new ref, so no history can
    refuse it) authenticates for receive-pack and stops before sending a ref update."""
    _run(_repo(fetched), "push", "--dry-run", "--quiet", "--no-verify", remote_url,
         f"{sha}:refs/heads/{probe_ref}", env=_git_env(git_env), credential=credential)


def _own_sibling(repo: git.Repo, current: str, sha: str, trailer: str) -> bool:
    """``current`` carries ``trailer`` and has the same single parent as ``sha``."""
    a, b = repo.commit(current), repo.commit(sha)
    return (build_request_of(a.message) == trailer and len(a.parents) == 1 and len(b.parents) == 1
            and a.parents[0].hexsha == b.parents[0].hexsha)


def reset_worktree(worktree: Path, sha: str) -> None:
    """Move a managed worktree's HEAD (and files) to ``sha``, e.g. off an earlier attempt's commit."""
    repo = git.Repo(worktree)
    if repo.head.commit.hexsha != sha:
        _run(repo, "reset", "--quiet", "--hard", sha)


def _only_own_commits_on_top(repo: git.Repo, base: str, head: str, trailers: tuple[str, ...]) -> bool:
    """``head`` descends from ``base`` through commits that each carry one of ``trailers`` only."""
    try:
        _run(repo, "merge-base", "--is-ancestor", base, head)
        on_top = _run(repo, "rev-list", f"{base}..{head}").split()
    except GitCommandFailed:
        return False
    return bool(on_top) and all(build_request_of(repo.commit(c).message) in trailers for c in on_top)


def adopt_pushed_commit(worktree: Path, remote_url: str, branch: str, *, request_id: str, parent: str,
                        git_env: dict[str, str] | None = None, credential: GitCredential | None = None) -> str | None:
    """The commit an earlier attempt of ``request_id`` already pushed on top of ``parent``, when the
    worktree's content equals it exactly; the worktree is then moved onto it (clean). None otherwise.

    Why: a re-run (or a retry on another worker) writes the same content again, but a commit made at
    another time or place can differ in its sha, and the branch only moves fast-forward. Reusing the
    pushed commit keeps one commit per request and lets the run continue instead of refusing."""
    current = remote_branch_sha(worktree, remote_url, branch, git_env=git_env, credential=credential)
    if current is None or current == parent:
        return None
    repo = git.Repo(worktree)
    try:
        _run(repo, "fetch", "--quiet", "--no-write-fetch-head", remote_url, f"refs/heads/{branch}",
             env=_git_env(git_env), credential=credential)
    except GitCommandFailed:
        return None
    commit = repo.commit(current)
    if build_request_of(commit.message) != request_id or [p.hexsha for p in commit.parents] != [parent]:
        return None
    _run(repo, "add", "--all")
    try:
        _run(repo, "diff", "--cached", "--quiet", current)
    except GitCommandFailed:
        return None  # different content: not ours to reuse
    _run(repo, "reset", "--quiet", "--hard", current)
    return current
