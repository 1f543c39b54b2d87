"""The real MarinSkyRL build-contract files (../shared/real-marinskyrl) as a commit of a temporary git repo.

Why a real repository: the service reads the contract from a commit (every `docker/Dockerfile*` in the
tree, the script, the prose); the tests read the real files the same way, optionally edited first.
"""

from __future__ import annotations

import shutil
from collections.abc import Callable
from pathlib import Path

import git
import pytest

from domain.contract import BuildContract, load_contract

# ../shared beside the checkout (also from a worktree under /work/wt/<name>: the nearest ancestor holding it).
REAL = next((p / "shared" / "real-marinskyrl" for p in Path(__file__).resolve().parents
             if (p / "shared" / "real-marinskyrl").is_dir()),
            Path(__file__).resolve().parents[3] / "shared" / "real-marinskyrl")
SCRIPT = "docker/build_gpu_rl_kaniko.sh"
DF_AMD = "docker/Dockerfile.gpu-rl"
DF_ARM = "docker/Dockerfile.gpu-rl-arm64"


def real_tree(era: str) -> Path:
    path = REAL / era
    if not path.is_dir():
        pytest.skip(f"real MarinSkyRL files not present at {path}")
    return path


def commit_tree(tmp_path: Path, era: str, edits: dict[str, Callable[[str], str]] | None = None, *,
                rest: bool = False, executable: tuple[str, ...] = ()) -> tuple[git.Repo, str]:
    """Copy ``era`` into a fresh repository (``rest``: with UPSTREAM_REST beside it), apply ``edits`` (path ->
    text edit; None deletes), mark the ``executable`` paths 0755 (committed with git's executable mode),
    commit."""
    dest = tmp_path / f"marinskyrl-{era}"
    shutil.copytree(real_tree(era), dest)
    if rest:
        add_upstream_rest(dest)
    for path, edit in (edits or {}).items():
        f = dest / path
        if edit is None:
            f.unlink()
            continue
        old = f.read_text() if f.exists() else ""  # a new file: the edit of an empty text
        new = edit(old)
        assert new != old, f"edit did not change {path}"
        f.parent.mkdir(parents=True, exist_ok=True)
        f.write_text(new)
    for path in executable:
        (dest / path).chmod(0o755)
    repo = git.Repo.init(dest, initial_branch="main")
    repo.git.add(A=True)
    repo.index.commit("real files", author=git.Actor("t", "t@example.invalid"),
                      committer=git.Actor("t", "t@example.invalid"))
    return repo, repo.head.commit.hexsha


def files_at(repo: git.Repo, sha: str) -> dict[str, str]:
    """Every file of the commit, as the service reads the contract from it."""
    tree = repo.commit(sha).tree
    return {b.path: b.data_stream.read().decode() for b in tree.traverse() if b.type == "blob"}


def real_contract(tmp_path: Path, era: str, edits: dict[str, Callable[[str], str] | None] | None = None
                  ) -> BuildContract:
    repo, sha = commit_tree(tmp_path, era, edits)
    return load_contract(files_at(repo, sha), sha)


def line_in(era: str, path: str, needle: str) -> int:
    """The line of ``needle`` in the real file (tests state the text they mean, not a bare number)."""
    for i, text in enumerate((real_tree(era) / path).read_text().splitlines(), 1):
        if needle in text:
            return i
    raise AssertionError(f"{needle!r} not in {era}/{path}")


# The rest of the upstream MarinSkyRL tree that the real Dockerfiles COPY (the shared copies keep only the
# build-contract files): stand-in content at the upstream paths, so a rehearsal's build context holds what
# a real checkout's bundle holds. Listed by hand from the upstream repository, not read from the Dockerfiles.
UPSTREAM_REST = {
    "pyproject.toml": '[project]\nname = "marinskyrl"\nversion = "0.0.0"\n',
    "uv.lock": "version = 1\n",
    "README.md": "# MarinSkyRL\n",
    "LICENSE": "Apache License 2.0\n",
    "chat_templates/README.md": "templates\n",
    "cloud/__init__.py": "",
    "cloud/iris/__init__.py": "",
    "skyrl-train/pyproject.toml": '[project]\nname = "skyrl-train"\n',
    "skyrl-gym/pyproject.toml": '[project]\nname = "skyrl-gym"\n',
    "docker/sync_gpu_rl_env.sh": "#!/usr/bin/env bash\n",
    "docker/validate_harbor_artifact_writer.py": "",
    "docker/validate_gpu_rl_pip_check.sh": "#!/usr/bin/env bash\n",
    "docker/wheelhouse/.keep": "",  # "docker/wheelhouse/ always exists (committed .keep)": Dockerfile.gpu-rl
}


def add_upstream_rest(dest: Path, skip: set[str] | frozenset[str] = frozenset()) -> None:
    for rel, text in UPSTREAM_REST.items():
        if rel not in skip and not (dest / rel).exists():
            (dest / rel).parent.mkdir(parents=True, exist_ok=True)
            (dest / rel).write_text(text)
