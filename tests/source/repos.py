"""Small real git remotes for the source tests, built with GitPython in a temp directory.

A Harbor-shaped remote with three commits whose ``pyproject.toml`` changes, and a MarinSkyRL-shaped
remote whose two Dockerfiles pin the first Harbor commit via ``ARG HARBOR_COMMIT=...``.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import git

AUTHOR = "Fixture Bot <fixture@example.invalid>"
DOCKERFILES = ["docker/Dockerfile.gpu-rl", "docker/Dockerfile.gpu-rl-arm64"]

HARBOR_V1 = """\
[project]
name = "harbor"
version = "0.1.0"
dependencies = [
    "pydantic>=2.6",
    "datasets>=2.19",
    "claude-agent-sdk==0.1.4",
    "Typer>=0.12",
    "rich",
]

[project.optional-dependencies]
analysis = ["pandas>=2.2", "matplotlib"]
datasets = ["huggingface_hub>=0.23"]
daytona = ["daytona-sdk==0.21.0"]
dev = ["pytest>=8"]
"""

# v2: datasets + claude-agent-sdk move into extras, a base dep is added, one spec changes.
HARBOR_V2 = """\
[project]
name = "harbor"
version = "0.2.0"
dependencies = [
    "pydantic>=2.8",
    "typer>=0.12",
    "rich",
    "httpx>=0.27",
]

[project.optional-dependencies]
analysis = ["pandas>=2.2", "matplotlib"]
datasets = ["huggingface_hub>=0.23", "datasets>=2.19"]
daytona = ["daytona-sdk==0.21.0"]
agents = ["claude-agent-sdk==0.1.4"]
dev = ["pytest>=8"]
"""

# v3: only a dev-extra change (not installed in the image) and README churn.
HARBOR_V3 = HARBOR_V2.replace('dev = ["pytest>=8"]', 'dev = ["pytest>=8.3", "ruff"]')

DOCKERFILE_AMD64 = """\
# syntax=docker/dockerfile:1.7
ARG CUDA_IMAGE=nvidia/cuda:12.9.2-cudnn-devel-ubuntu22.04
FROM ${{CUDA_IMAGE}} AS base
ARG HARBOR_COMMIT={harbor}
ARG VLLM_FORK_COMMIT=4b55591306c9aaaaaaaaaaaaaaaaaaaaaaaaaaaa
ARG FLASH_ATTN_VERSION=2.8.3
ARG TORCH_VERSION=2.11.0
COPY pyproject.toml uv.lock README.md /opt/skyrl/
RUN uv pip install "harbor[analysis,datasets,daytona] @ git+https://github.com/marin-community/harbor.git@${{HARBOR_COMMIT}}" \\
    fastapi==0.136.1
"""

DOCKERFILE_ARM64 = DOCKERFILE_AMD64.replace("AS base", "AS base-arm64")


@dataclass
class Remotes:
    harbor_url: str
    harbor_commits: list[str]
    marinskyrl_url: str
    marinskyrl_head: str


def _commit(repo: git.Repo, files: dict[str, str | bytes], message: str, when: int) -> str:
    assert repo.working_tree_dir is not None
    for rel, content in files.items():
        path = Path(repo.working_tree_dir) / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        if isinstance(content, bytes):
            path.write_bytes(content)
        else:
            path.write_text(content)
        if rel.endswith(".sh"):
            path.chmod(0o755)
    repo.git.add("--all")
    stamp = f"{when} +0000"
    env = {
        "GIT_AUTHOR_NAME": "Fixture Bot", "GIT_AUTHOR_EMAIL": "fixture@example.invalid",
        "GIT_COMMITTER_NAME": "Fixture Bot", "GIT_COMMITTER_EMAIL": "fixture@example.invalid",
        "GIT_AUTHOR_DATE": stamp, "GIT_COMMITTER_DATE": stamp,
    }
    repo.git.execute(["git", "-c", "commit.gpgsign=false", "commit", "--quiet", "-m", message], env=env)
    return repo.head.commit.hexsha


def make_remote(root: Path, name: str, history: list[tuple[dict[str, str | bytes], str]]) -> tuple[str, list[str]]:
    """A bare remote ``root/<name>.git`` (default branch main) with one commit per history step."""
    bare = root / f"{name}.git"
    git.Repo.init(bare, bare=True, initial_branch="main")
    work = git.Repo.init(root / f"{name}-seed", initial_branch="main")
    shas = [_commit(work, files, msg, 1_700_000_000 + i * 60) for i, (files, msg) in enumerate(history)]
    work.git.push(str(bare), "main:refs/heads/main")
    return f"file://{bare}", shas


def commit_to_remote(url: str, files: dict[str, str | bytes], message: str, workdir: Path,
                     branch: str = "main") -> str:
    """Push one more commit onto ``branch`` of a remote through a temporary clone."""
    clone = git.Repo.clone_from(url, workdir, branch=branch)
    sha = _commit(clone, files, message, int(clone.head.commit.committed_date) + 60)
    clone.git.push("origin", f"HEAD:refs/heads/{branch}")
    return sha


def make_remotes(root: Path) -> Remotes:
    root.mkdir(parents=True, exist_ok=True)
    harbor_url, harbor_commits = make_remote(root, "harbor", [
        ({"pyproject.toml": HARBOR_V1, "src/harbor/__init__.py": '__version__ = "0.1.0"\n'}, "harbor 0.1"),
        ({"pyproject.toml": HARBOR_V2, "src/harbor/__init__.py": '__version__ = "0.2.0"\n'}, "harbor 0.2"),
        ({"pyproject.toml": HARBOR_V3, "README.md": "harbor\n"}, "harbor: dev tools"),
    ])
    old = harbor_commits[0]
    msr_url, msr_commits = make_remote(root, "marinskyrl", [
        ({
            DOCKERFILES[0]: DOCKERFILE_AMD64.format(harbor=old),
            DOCKERFILES[1]: DOCKERFILE_ARM64.format(harbor=old),
            "docker/build_gpu_rl_kaniko.sh": "#!/usr/bin/env bash\n: \"${GITSHA:?}\"\necho build\n",
            ".gitignore": "*.log\nwheelhouse-cache/\n",
            "pyproject.toml": '[project]\nname = "marinskyrl"\nversion = "0"\n',
            "uv.lock": "version = 1\n",
            "README.md": "MarinSkyRL\n",
            "skyrl-train/skyrl_train/__init__.py": "",
            "cloud/iris/run_rl.py": "print('run')\n",
        }, "initial"),
    ])
    return Remotes(harbor_url=harbor_url, harbor_commits=harbor_commits, marinskyrl_url=msr_url,
                   marinskyrl_head=msr_commits[-1])


def bare_path(url: str) -> str:
    return url.removeprefix("file://")


def tree_files(root: Path) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in root.rglob("*") if p.is_file() and ".git" not in p.parts)

