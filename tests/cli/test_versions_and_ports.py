"""``--version`` on both entry points (from the package metadata, else pyproject.toml), and a worker whose
``--metrics``/``--health`` port is taken: one line naming the flag and the port, exit 2, no traceback,
before any connection is attempted (the config's Temporal address points nowhere)."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import tomllib
from importlib import metadata
from pathlib import Path

import pytest

from runtime.version import version
from tests.deploy.wheel_venv import minimal_config

ROOT = Path(__file__).resolve().parents[2]
PYPROJECT_VERSION = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]


def _run(*argv: str, timeout: float = 120) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TEMPORAL_", "GPU_RL_BUILDER_"))}
    return subprocess.run([sys.executable, *argv], cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout)


@pytest.mark.parametrize(("script", "prog"), [("starter.py", "gpu-rl-builder"), ("worker.py", "gpu-rl-builder-worker")])
def test_version_flag_prints_the_package_version(script, prog):
    ran = _run(script, "--version")
    assert ran.returncode == 0, ran.stderr
    assert ran.stdout.strip() == f"{prog} {version()}"
    assert version() == PYPROJECT_VERSION  # this checkout's metadata and its pyproject agree


def test_version_falls_back_to_pyproject_when_not_installed(tmp_path):
    assert version("gpu-rl-builder-not-installed-anywhere") == PYPROJECT_VERSION
    (tmp_path / "pyproject.toml").write_text('[project]\nname = "x"\nversion = "9.8.7"\n')
    assert version("gpu-rl-builder-not-installed-anywhere", tmp_path / "pyproject.toml") == "9.8.7"
    assert "unknown" in version("gpu-rl-builder-not-installed-anywhere", tmp_path / "missing.toml")
    with pytest.raises(metadata.PackageNotFoundError):
        metadata.version("gpu-rl-builder-not-installed-anywhere")


@pytest.fixture
def taken_port():
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        yield s.getsockname()[1]


@pytest.mark.parametrize("flag", ["--metrics", "--health"])
def test_worker_on_a_taken_port_says_so_in_one_line_and_exits_2(tmp_path, taken_port, flag):
    config = minimal_config(tmp_path, "q-port")
    ran = _run("worker.py", "--config", str(config), flag, f"127.0.0.1:{taken_port}")
    assert ran.returncode == 2, ran.stdout + ran.stderr
    lines = ran.stderr.strip().splitlines()
    assert len(lines) == 1, ran.stderr
    assert lines[0].startswith("error: ") and flag in lines[0] and str(taken_port) in lines[0]
    assert "already in use" in lines[0] and "Traceback" not in ran.stderr


def test_worker_metrics_flag_without_a_port_is_refused_by_name(tmp_path):
    ran = _run("worker.py", "--config", str(minimal_config(tmp_path, "q-port")), "--metrics", "localhost")
    assert ran.returncode == 2 and ran.stderr.strip() == "error: --metrics localhost: expected HOST:PORT, e.g. 0.0.0.0:9464"
