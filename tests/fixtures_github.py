"""GitHub stand-in fixture: a tiny real bare repo served by ``sandbox.github_standin`` (in a thread).

The repo ``acme/widgets`` has ``main`` plus two branches cut from its first commit:
``feature`` (edits ``pins.txt``, merges cleanly) and ``conflict`` (edits ``README``, which ``main``
also edited afterwards, so it cannot merge).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import git
import pytest

from clients.github import GitHubClient
from sandbox.github_standin import GitHubStandinHandle, start_github_standin

STANDIN_REPO = "acme/widgets"


@dataclass
class GitHubStandinRepo:
    """A running stand-in plus the bare repo behind ``repo`` and a work clone to push from."""

    handle: GitHubStandinHandle
    repo: str
    bare: Path
    work: git.Repo
    state_dir: Path

    @property
    def api_url(self) -> str:
        return self.handle.api_url

    @property
    def token(self) -> str:
        return self.handle.token

    def client(self, token: str | None = None) -> GitHubClient:
        """A client for ``repo`` (use ``async with``); ``token`` overrides the accepted one."""
        return GitHubClient(self.api_url, self.token if token is None else token, self.repo)

    def branch_sha(self, branch: str) -> str:
        return git.Repo(self.bare).commit(f"refs/heads/{branch}").hexsha

    def push_commit(self, branch: str, path: str, content: str, message: str = "update") -> str:
        """Commit ``content`` to ``path`` on ``branch`` and push it to the bare repo; returns the sha."""
        self.work.git.fetch("origin")
        self.work.git.checkout("-B", branch, f"origin/{branch}")
        (Path(self.work.working_dir) / path).write_text(content)
        self.work.git.add(path)
        self.work.git.commit("-m", message)
        self.work.git.push("origin", f"HEAD:refs/heads/{branch}")
        return self.work.head.commit.hexsha


def make_standin_bare_repo(root: Path) -> tuple[Path, git.Repo]:
    """Create ``root/widgets.git`` (bare) and ``root/work`` (a clone with identity set)."""
    bare = root / "widgets.git"
    git.Repo.init(bare, bare=True, initial_branch="main")
    work = git.Repo.clone_from(bare, root / "work")
    with work.config_writer() as cw:
        cw.set_value("user", "name", "Test Author")
        cw.set_value("user", "email", "author@example.invalid")
    wd = Path(work.working_dir)

    def commit(files: dict[str, str], message: str) -> None:
        for name, text in files.items():
            (wd / name).write_text(text)
        work.git.add(*files)
        work.git.commit("-m", message)

    work.git.checkout("-b", "main")
    commit({"README": "hello\n", "pins.txt": "pin=old\n"}, "initial")
    work.git.branch("feature")
    work.git.branch("conflict")
    commit({"README": "hello from main\n"}, "main edits README")
    work.git.checkout("feature")
    commit({"pins.txt": "pin=new\n"}, "bump pin")
    work.git.checkout("conflict")
    commit({"README": "hello from conflict\n"}, "conflicting README")
    work.git.push("origin", "main", "feature", "conflict")
    work.git.checkout("main")
    return bare, work


@pytest.fixture
def github_standin(tmp_path: Path) -> Iterator[GitHubStandinRepo]:
    """A fresh stand-in serving ``acme/widgets``; stopped after the test."""
    bare, work = make_standin_bare_repo(tmp_path / "gh-remotes")
    state_dir = tmp_path / "gh-state"
    handle = start_github_standin(state_dir, {STANDIN_REPO: str(bare)})
    try:
        yield GitHubStandinRepo(handle=handle, repo=STANDIN_REPO, bare=bare, work=work, state_dir=state_dir)
    finally:
        handle.stop()
