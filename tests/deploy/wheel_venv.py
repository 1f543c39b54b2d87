"""Run the worker image's install steps outside a container, once per test session.

The steps are read from ``docker/Dockerfile`` itself (every RUN that calls ``docker/install.py`` or the
worker) and run with the container paths mapped to a temporary directory, so a tool or package the
Dockerfile forgets is missing here too. Differences, on purpose: kubectl comes from a local mirror with
its checksum overridden (the tests have no route to dl.k8s.io; ``test_image`` checks the pinned sums
separately), and pip may use its cache. Commands run from an empty directory: the source folder is
never on sys.path, so anything left out of the wheel fails as it would in the image.
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import dockerfile

ROOT = Path(__file__).resolve().parents[2]
DOCKERFILE = ROOT / "docker" / "Dockerfile"
_SKIP = shutil.ignore_patterns(".venv", ".git", "__pycache__", "*.egg-info", "build", "dist", "tests",
                               ".state", ".pytest_cache", ".ruff_cache", "bench", "docs")
FAKE_KUBECTL = "#!/bin/sh\necho 'Client Version: v0.0.0-test'\n"


@dataclass
class WheelVenv:
    wheel: Path
    prefix: Path
    workdir: Path  # an empty directory: the source folder is not on sys.path
    git_only: Path  # a PATH entry with git alone (the image's apt layer)
    steps: list[str]  # the Dockerfile commands that were run, after path mapping

    @property
    def bin(self) -> Path:
        return self.prefix / "bin"

    def env(self, **extra: str) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items()
               if not k.startswith(("TEMPORAL_", "GPU_RL_BUILDER_", "PYTHON", "VIRTUAL_ENV"))}
        env["PATH"] = f"{self.bin}{os.pathsep}{self.git_only}"
        env.update(extra)
        return env

    def run(self, *argv: str, timeout: float = 120, **extra_env: str) -> subprocess.CompletedProcess:
        return subprocess.run(argv, cwd=self.workdir, env=self.env(**extra_env), capture_output=True, text=True,
                              timeout=timeout)


def dockerfile_stages() -> list[list[dockerfile.Command]]:
    stages: list[list[dockerfile.Command]] = []
    for command in dockerfile.parse_file(str(DOCKERFILE)):
        if command.cmd == "FROM":
            stages.append([])
        stages[-1].append(command)
    return stages


def install_steps() -> list[tuple[str, str]]:
    """(WORKDIR, shell command) of every RUN that installs or checks the service, in Dockerfile order."""
    steps, workdir = [], "/"
    for stage in dockerfile_stages():
        for command in stage:
            if command.cmd == "WORKDIR":
                workdir = command.value[0]
            elif command.cmd == "RUN" and re.search(r"install\.py|gpu-rl-builder-worker ", command.value[0]):
                steps.append((workdir, command.value[0]))
    return steps


def _mapped(command: str, paths: dict[str, str]) -> str:
    command = command.replace("PIP_NO_CACHE_DIR=1 ", "")  # the image keeps no cache; the tests may
    command = re.sub(r"(^|&&\s*)python ", lambda m: f"{m.group(1)}{sys.executable} ", command)
    for container, local in sorted(paths.items(), key=lambda kv: -len(kv[0])):
        command = re.sub(rf"(?<![\w/.-]){re.escape(container)}(?![\w.-])", local, command)
    return command


def kubectl_mirror(base: Path) -> dict[str, str]:
    """A local kubectl download tree and the overrides that make install.py use it."""
    arch = {"x86_64": "amd64", "aarch64": "arm64"}.get(os.uname().machine, os.uname().machine)
    binary = base / "v0.0.0-test" / "bin" / "linux" / arch / "kubectl"
    binary.parent.mkdir(parents=True)
    binary.write_text(FAKE_KUBECTL)
    return {"TARGETARCH": arch, "KUBECTL_BASE_URL": base.as_uri(), "KUBECTL_VERSION": "v0.0.0-test",
            "KUBECTL_SHA256": hashlib.sha256(FAKE_KUBECTL.encode()).hexdigest()}


def build_wheel_venv(base: Path) -> WheelVenv:
    src, dist, prefix, workdir, git_only = (base / n for n in ("src", "dist", "venv", "work", "git-only"))
    shutil.copytree(ROOT, src, ignore=_SKIP)
    workdir.mkdir()
    git_only.mkdir()
    (git_only / "git").symlink_to(shutil.which("git"))
    paths = {"/src": str(src), "/dist": str(dist), "/opt/gpu-rl-builder/install": str(src / "docker"),
             "/opt/gpu-rl-builder/venv": str(prefix), "/opt/gpu-rl-builder/dist": str(dist),
             "/opt/gpu-rl-builder/config.example.toml": str(src / "deploy" / "config.example.toml")}
    # PYTHONPATH too: a source tree on it carries the editable install's egg-info, and pip would then take
    # the wheel as "already satisfied" and install no console script (the image has no such path).
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("TEMPORAL_", "GPU_RL_BUILDER_", "VIRTUAL_ENV", "PYTHONPATH"))}
    env.update(kubectl_mirror(base / "kubectl-mirror"))
    env["PATH"] = f"{prefix / 'bin'}{os.pathsep}{git_only}{os.pathsep}/usr/bin:/bin"
    ran = []
    for container_workdir, command in install_steps():
        local = _mapped(command, paths)
        cwd = paths.get(container_workdir, str(workdir))
        out = subprocess.run(["bash", "-o", "pipefail", "-c", local], cwd=cwd, env=env, capture_output=True,
                             text=True, timeout=900)
        if out.returncode != 0:
            raise RuntimeError(f"Dockerfile step failed ({out.returncode}): {local}\n{out.stdout[-3000:]}\n"
                               f"{out.stderr[-3000:]}")
        ran.append(local)
    (wheel,) = dist.glob("gpu_rl_builder-*.whl")
    return WheelVenv(wheel=wheel, prefix=prefix, workdir=workdir, git_only=git_only, steps=ran)


def minimal_config(tmp: Path, task_queue: str) -> Path:
    """A valid service config whose [temporal] section points nowhere (flags and env must win)."""
    path = tmp / "config.toml"
    path.write_text(f"""
work_dir = "{tmp / 'work'}"
[temporal]
address = "127.0.0.1:1"   # overridden by --address: proves the flag wins
namespace = "nowhere"     # overridden by TEMPORAL_NAMESPACE
task_queue = "{task_queue}"
[repos]
marinskyrl_url = "file:///nonexistent/MarinSkyRL.git"
harbor_url = "file:///nonexistent/harbor.git"
[clusters.local]
controller_url = "http://127.0.0.1:1"
client_revision_date = "2026-11-20"
[registry]
image_repository = "127.0.0.1:5000/gpu-rl"
user = {{kind = "literal_public", value = "builder"}}
token = {{kind = "env", name = "UNUSED_REGISTRY_TOKEN"}}
""")
    return path
