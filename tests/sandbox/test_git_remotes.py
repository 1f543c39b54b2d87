"""Seeded remotes: stable SHAs, the MarinSkyRL pin on Harbor's first commit, test-made commits."""

from __future__ import annotations

import tomllib

import git

from sandbox.git_remotes import (
    HARBOR_PLACEHOLDER,
    advance_harbor,
    commit_to_remote,
    remote_head,
    seed_remotes,
)


def _show(url: str, rev_path: str) -> str:
    return git.Repo(url.removeprefix("file://")).git.show(rev_path)


def test_seeding_is_deterministic(tmp_path, seeded_remotes):
    again = seed_remotes(tmp_path / "again")
    assert again.harbor_commits == seeded_remotes.harbor_commits
    assert again.marinskyrl_head == seeded_remotes.marinskyrl_head
    assert len(seeded_remotes.harbor_commits) >= 2
    assert remote_head(seeded_remotes.harbor_url) == seeded_remotes.harbor_head
    assert remote_head(seeded_remotes.marinskyrl_url) == seeded_remotes.marinskyrl_head


def test_marinskyrl_pins_first_harbor_commit(seeded_remotes):
    repo = git.Repo(seeded_remotes.marinskyrl_url.removeprefix("file://"))
    files = repo.git.ls_tree("-r", "--name-only", "main").splitlines()
    texts = [repo.git.show(f"main:{f}") for f in files if f.startswith("docker/Dockerfile")]
    assert texts, files
    assert all(seeded_remotes.harbor_pinned in t for t in texts)
    grep = repo.git.grep("-l", "-F", HARBOR_PLACEHOLDER, "main", with_exceptions=False)
    assert grep == ""
    assert seeded_remotes.harbor_pinned != seeded_remotes.harbor_head


def test_harbor_history_moves_datasets_into_extra(seeded_remotes):
    first = tomllib.loads(_show(seeded_remotes.harbor_url, f"{seeded_remotes.harbor_pinned}:pyproject.toml"))
    head = tomllib.loads(_show(seeded_remotes.harbor_url, f"{seeded_remotes.harbor_head}:pyproject.toml"))
    assert any(d.startswith("datasets") for d in first["project"]["dependencies"])
    assert not any(d.startswith("datasets") for d in head["project"]["dependencies"])
    assert any(d.startswith("datasets") for d in head["project"]["optional-dependencies"]["datasets"])
    assert {"analysis", "datasets", "daytona"} <= set(head["project"]["optional-dependencies"])


def test_advance_harbor_and_commit_to_remote(seeded_remotes):
    before = list(seeded_remotes.harbor_commits)
    sha = advance_harbor(seeded_remotes, 5)
    assert seeded_remotes.harbor_commits == [*before, sha]
    assert remote_head(seeded_remotes.harbor_url) == sha
    extras = tomllib.loads(_show(seeded_remotes.harbor_url, f"{sha}:pyproject.toml"))["project"][
        "optional-dependencies"
    ]
    assert "daytona" not in extras

    sha2 = commit_to_remote(seeded_remotes.marinskyrl_url, {"cloud/iris/notes.txt": "hello\n"}, "Only cloud/iris")
    repo = git.Repo(seeded_remotes.marinskyrl_url.removeprefix("file://"))
    assert repo.commit("main").hexsha == sha2
    assert repo.commit("main").parents[0].hexsha == seeded_remotes.marinskyrl_head
    changed = repo.git.diff("--name-only", seeded_remotes.marinskyrl_head, sha2).splitlines()
    assert changed == ["cloud/iris/notes.txt"]
