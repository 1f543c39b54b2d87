"""Bare git remotes for Harbor and MarinSkyRL, seeded from the fixtures with stable SHAs.

Why deterministic: author/committer names and dates are fixed, so the same fixtures always give the
same commits, and tests (and recorded histories) can name them. Later commits made by tests get a
date one hour after their parent, so they are deterministic too.
"""

from __future__ import annotations

import json
import shutil
import tempfile
from datetime import datetime, timedelta
from pathlib import Path

import git
from pydantic import BaseModel

FIXTURES = Path(__file__).parent / "fixtures"
HARBOR_FIXTURE = FIXTURES / "harbor"
MARINSKYRL_FIXTURE = FIXTURES / "marinskyrl"
HARBOR_PLACEHOLDER = "{{HARBOR_COMMIT}}"
DEFAULT_BRANCH = "main"
FIRST_DATE = datetime.fromisoformat("2026-07-01T12:00:00+00:00")
SKIP_NAMES = {"__pycache__", ".pytest_cache", ".ruff_cache", ".mypy_cache"}
_ACTOR = git.Actor("Sandbox Fixture", "sandbox-fixture@users.noreply.github.com")


class SeededRemotes(BaseModel):
    """Where the seeded remotes are and which commits they hold (mutated by ``advance_harbor``)."""

    root: Path
    harbor_url: str
    marinskyrl_url: str
    default_branch: str = DEFAULT_BRANCH
    harbor_commits: list[str]  # oldest first; [0] is the one MarinSkyRL pins
    marinskyrl_head: str

    @property
    def harbor_pinned(self) -> str:
        return self.harbor_commits[0]

    @property
    def harbor_head(self) -> str:
        return self.harbor_commits[-1]


def _file_url(path: Path) -> str:
    return path.resolve().as_uri()


def _url_path(url: str) -> Path:
    return Path(url.removeprefix("file://")) if url.startswith("file://") else Path(url)


def load_harbor_history() -> list[dict]:
    return json.loads((HARBOR_FIXTURE / "history.json").read_text())["steps"]


def _copy_tree(src: Path, dst: Path, substitutions: dict[str, str] | None = None) -> None:
    """Copy a fixture tree, skipping caches and substituting placeholders in text files."""
    for path in sorted(src.rglob("*")):
        rel = path.relative_to(src)
        if any(part in SKIP_NAMES for part in rel.parts) or path.suffix == ".pyc":
            continue
        target = dst / rel
        if path.is_dir():
            target.mkdir(parents=True, exist_ok=True)
            continue
        target.parent.mkdir(parents=True, exist_ok=True)
        data = path.read_bytes()
        if substitutions:
            try:
                text = data.decode()
            except UnicodeDecodeError:
                pass
            else:
                for old, new in substitutions.items():
                    text = text.replace(old, new)
                data = text.encode()
        target.write_bytes(data)
        shutil.copymode(path, target)


def _apply_step(work: Path, step: dict) -> None:
    if "tree" in step:
        _copy_tree(HARBOR_FIXTURE / step["tree"], work)
    for rel, edits in step.get("replace", {}).items():
        f = work / rel
        text = f.read_text()
        for old, new in edits:
            if old not in text:
                raise ValueError(f"harbor history step {step['step']}: {rel!r} has no {old!r}")
            text = text.replace(old, new, 1)
        f.write_text(text)
    _write_files(work, step.get("files", {}))


def _write_files(work: Path, files: dict[str, str | None]) -> None:
    for rel, text in files.items():
        f = work / rel
        if text is None:
            f.unlink(missing_ok=True)
        else:
            f.parent.mkdir(parents=True, exist_ok=True)
            f.write_text(text)


def _commit_all(repo: git.Repo, message: str, when: datetime) -> str:
    repo.git.add("-A")
    stamp = f"{int(when.timestamp())} +0000"  # git raw date format
    commit = repo.index.commit(
        message, author=_ACTOR, committer=_ACTOR, author_date=stamp, commit_date=stamp
    )
    return commit.hexsha


def _init_bare(path: Path) -> None:
    git.Repo.init(path, bare=True, initial_branch=DEFAULT_BRANCH)


def _next_date(repo: git.Repo) -> datetime:
    try:
        head = repo.head.commit
    except ValueError:
        return FIRST_DATE
    return head.committed_datetime + timedelta(hours=1)


def seed_remotes(root: Path) -> SeededRemotes:
    """Create ``root/harbor.git`` and ``root/marinskyrl.git`` from the fixtures.

    Harbor gets every history step marked ``seed``; MarinSkyRL gets one commit of its fixture tree
    with ``{{HARBOR_COMMIT}}`` set to Harbor's first commit, so Harbor's head is a real move.
    """
    root = Path(root)
    root.mkdir(parents=True, exist_ok=True)
    harbor_bare, msrl_bare = root / "harbor.git", root / "marinskyrl.git"
    if not MARINSKYRL_FIXTURE.is_dir():
        raise FileNotFoundError(f"MarinSkyRL fixture missing: {MARINSKYRL_FIXTURE}")
    _init_bare(harbor_bare)
    _init_bare(msrl_bare)
    harbor_commits: list[str] = []
    with tempfile.TemporaryDirectory(prefix="seed-") as tmp:
        work = Path(tmp) / "harbor"
        repo = git.Repo.init(work, initial_branch=DEFAULT_BRANCH)
        for i, step in enumerate(s for s in load_harbor_history() if s.get("seed")):
            _apply_step(work, step)
            harbor_commits.append(_commit_all(repo, step["message"], FIRST_DATE + timedelta(hours=i)))
        repo.git.push(str(harbor_bare), f"{DEFAULT_BRANCH}:{DEFAULT_BRANCH}")

        work = Path(tmp) / "marinskyrl"
        repo = git.Repo.init(work, initial_branch=DEFAULT_BRANCH)
        _copy_tree(MARINSKYRL_FIXTURE, work, {HARBOR_PLACEHOLDER: harbor_commits[0]})
        msrl_head = _commit_all(repo, "MarinSkyRL sandbox fixture", FIRST_DATE + timedelta(days=1))
        repo.git.push(str(msrl_bare), f"{DEFAULT_BRANCH}:{DEFAULT_BRANCH}")
    return SeededRemotes(
        root=root,
        harbor_url=_file_url(harbor_bare),
        marinskyrl_url=_file_url(msrl_bare),
        harbor_commits=harbor_commits,
        marinskyrl_head=msrl_head,
    )


def seed_tree_remote(path: Path, tree: Path, files: dict[str, str | None] | None = None,
                     message: str = "MarinSkyRL tree") -> tuple[str, str]:
    """A bare remote at ``path`` holding one commit of ``tree`` (e.g. a real MarinSkyRL checkout) plus ``files``.

    Why: the service must plan from the real upstream files, not only from the fixture; this seeds a
    remote the configuration can point ``repos.marinskyrl_url`` at. Returns (file URL, head SHA).
    """
    path = Path(path)
    _init_bare(path)
    with tempfile.TemporaryDirectory(prefix="seed-tree-") as tmp:
        work = Path(tmp) / "tree"
        repo = git.Repo.init(work, initial_branch=DEFAULT_BRANCH)
        _copy_tree(Path(tree), work)
        _write_files(work, files or {})
        head = _commit_all(repo, message, FIRST_DATE + timedelta(days=1))
        repo.git.push(str(path), f"{DEFAULT_BRANCH}:{DEFAULT_BRANCH}")
    return _file_url(path), head


def commit_to_remote(
    url: str, files: dict[str, str | None], message: str, *, branch: str = DEFAULT_BRANCH
) -> str:
    """Commit ``files`` ({path: text, or None to delete}) on ``branch`` of a remote; return the SHA."""
    return _commit_via_clone(url, message, branch, lambda work: _write_files(work, files))


def _commit_via_clone(url: str, message: str, branch: str, edit) -> str:
    with tempfile.TemporaryDirectory(prefix="commit-") as tmp:
        work = Path(tmp) / "clone"
        repo = git.Repo.clone_from(url, work, branch=branch)
        edit(work)
        sha = _commit_all(repo, message, _next_date(repo))
        repo.git.push("origin", f"HEAD:{branch}")
        return sha


def advance_harbor(seeded: SeededRemotes, step: int) -> str:
    """Apply Harbor history step ``step`` (one not seeded, e.g. 4 or 5) and record the new head."""
    matches = [s for s in load_harbor_history() if s["step"] == step]
    if not matches:
        raise KeyError(f"no harbor history step {step}")
    sha = _commit_via_clone(
        seeded.harbor_url, matches[0]["message"], seeded.default_branch, lambda w: _apply_step(w, matches[0])
    )
    seeded.harbor_commits.append(sha)
    return sha


def remote_head(url: str, branch: str = DEFAULT_BRANCH) -> str:
    """The commit ``branch`` points at in a bare remote."""
    return git.Repo(_url_path(url)).commit(branch).hexsha
