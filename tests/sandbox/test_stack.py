"""The composed sandbox: it writes a valid config without secrets and leaves no process behind."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from domain.config import load_config
from sandbox.stack import SandboxStack, _alive, stop_recorded

pytestmark = pytest.mark.stack
REPO_ROOT = Path(__file__).resolve().parents[2]


def _wait_gone(pids: list[int], timeout: float = 20.0) -> list[int]:
    deadline = time.monotonic() + timeout
    while (alive := [p for p in pids if _alive(p)]) and time.monotonic() < deadline:
        time.sleep(0.1)
    return alive


def _recorded_pids(info: dict) -> list[int]:
    return [info[k]["pid"] for k in ("temporal", "iris", "registry_open", "registry_token")]


def test_stack_writes_valid_config_and_stops_everything(tmp_path):
    with SandboxStack(tmp_path / "state") as stack:
        cfg = load_config(stack.config_path)
        assert set(cfg.clusters) == {"sandbox-amd64", "sandbox-arm64"}
        assert cfg.clusters["sandbox-arm64"].job_env == {"SANDBOX_UNAME_M": "aarch64"}
        assert cfg.clusters["sandbox-arm64"].architecture == "arm64"
        assert cfg.clusters["sandbox-amd64"].architecture == "amd64"
        assert cfg.clusters["sandbox-amd64"].controller_url == stack.iris.url
        assert cfg.registry.image_repository == f"{stack.token_registry.host}/marin-community/marinskyrl"
        assert stack.token_registry.host in cfg.registry.insecure_hosts
        assert cfg.registry.user.kind == "literal_public" and cfg.registry.user.value == stack.token_registry.push_user
        token_file = Path(cfg.registry.token.path)
        assert token_file.stat().st_mode & 0o777 == 0o600
        secret = token_file.read_text()
        assert secret == stack.token_registry.push_token
        for written in (stack.config_path, stack.stack_json, stack.state_dir / "remotes.json"):
            assert secret not in written.read_text()
        assert cfg.temporal.address == stack.temporal.address and cfg.temporal.ui_url
        assert httpx.get(f"{stack.iris.url}/health", timeout=5).status_code == 200
        assert httpx.get(f"{stack.open_registry.url}/v2/", timeout=5).status_code == 200
        assert httpx.get(f"{stack.token_registry.url}/v2/", timeout=5).status_code == 401
        assert cfg.repos.harbor_url == stack.remotes.harbor_url
        if stack.github is not None:
            assert cfg.github is not None and cfg.github.api_url == stack.github.api_url
            assert stack.github.token not in stack.config_path.read_text()
        pids = stack.pids()
        assert pids and all(_alive(p) for p in pids)
    assert _wait_gone(pids) == []


def _start_up(state_dir: Path) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "sandbox", "up", "--state-dir", str(state_dir)],
        cwd=REPO_ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True,
    )


def _wait_up(proc: subprocess.Popen) -> str:
    lines = []
    for line in proc.stdout:  # type: ignore[union-attr]
        lines.append(line)
        if line.startswith("sandbox up"):
            return "".join(lines)
    raise AssertionError(f"`sandbox up` exited {proc.wait()}: {''.join(lines)[-3000:]}")


@pytest.mark.parametrize("how", ["down", "sigterm"])
def test_cli_up_then_down_or_sigterm_leaves_no_process(tmp_path, how):
    state = tmp_path / "state"
    proc = _start_up(state)
    try:
        out = _wait_up(proc)
        assert "Temporal UI: http://127.0.0.1:" in out
        info = json.loads((state / "stack.json").read_text())
        pids = _recorded_pids(info)
        assert info["supervisor_pid"] == proc.pid and all(_alive(p) for p in pids)
        status = subprocess.run([sys.executable, "-m", "sandbox", "status", "--state-dir", str(state)],
                                cwd=REPO_ROOT, capture_output=True, text=True, timeout=60)
        assert status.returncode == 0 and json.loads(status.stdout)["temporal"]["alive"] is True
        if how == "down":
            down = subprocess.run([sys.executable, "-m", "sandbox", "down", "--state-dir", str(state)],
                                  cwd=REPO_ROOT, capture_output=True, text=True, timeout=120)
            assert down.returncode == 0, down.stdout + down.stderr
        else:
            os.kill(proc.pid, signal.SIGTERM)
        assert proc.wait(timeout=60) == 0
        assert _wait_gone([proc.pid, *pids]) == []
        status = subprocess.run([sys.executable, "-m", "sandbox", "status", "--state-dir", str(state)],
                                cwd=REPO_ROOT, capture_output=True, text=True, timeout=60)
        assert status.returncode == 1
    finally:
        stop_recorded(state)  # the services run in their own sessions: never leave them behind
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
