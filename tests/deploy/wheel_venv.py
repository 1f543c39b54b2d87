"""Build the project's wheel and install it into a fresh venv, once per test session.

The venv never sees the source folder: commands run from an empty directory, so anything missing
from the wheel (a package, an entry point) fails here as it would in the worker image.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import venv
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
_SKIP = shutil.ignore_patterns(".venv", ".git", "__pycache__", "*.egg-info", "build", "dist", "tests",
                               ".state", ".pytest_cache", ".ruff_cache", "bench", "docs")


@dataclass
class WheelVenv:
    wheel: Path
    prefix: Path
    workdir: Path  # an empty directory: the source folder is not on sys.path

    @property
    def bin(self) -> Path:
        return self.prefix / "bin"

    def env(self, **extra: str) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items()
               if not k.startswith(("TEMPORAL_", "GPU_RL_BUILDER_", "PYTHON", "VIRTUAL_ENV"))}
        env["PATH"] = f"{self.bin}{os.pathsep}{env.get('PATH', '')}"
        env.update(extra)
        return env

    def run(self, *argv: str, timeout: float = 120, **extra_env: str) -> subprocess.CompletedProcess:
        return subprocess.run(argv, cwd=self.workdir, env=self.env(**extra_env), capture_output=True, text=True,
                              timeout=timeout)


def _pip(python: Path, *args: str, timeout: float = 600) -> None:
    out = subprocess.run([str(python), "-m", "pip", "--disable-pip-version-check", *args],
                         capture_output=True, text=True, timeout=timeout)
    if out.returncode != 0:
        raise RuntimeError(f"pip {' '.join(args)} failed ({out.returncode}):\n{out.stdout[-3000:]}\n{out.stderr[-3000:]}")


def build_wheel_venv(base: Path) -> WheelVenv:
    """Copy the source (so the build leaves nothing in the worktree), build the wheel, install it."""
    src, dist, prefix, workdir = base / "src", base / "dist", base / "venv", base / "work"
    shutil.copytree(ROOT, src, ignore=_SKIP)
    workdir.mkdir()
    _pip(Path(sys.executable), "wheel", "--no-deps", "--wheel-dir", str(dist), str(src))
    (wheel,) = dist.glob("gpu_rl_builder-*.whl")
    venv.EnvBuilder(with_pip=True, clear=True).create(prefix)
    _pip(prefix / "bin" / "python", "install", str(wheel))
    return WheelVenv(wheel=wheel, prefix=prefix, workdir=workdir)


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
user = {{kind = "literal_public", value = "builder"}}
token = {{kind = "env", name = "UNUSED_REGISTRY_TOKEN"}}
""")
    return path
