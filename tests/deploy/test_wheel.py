"""``pip install .`` gives a working service: every package in the wheel, both entry points run from an
empty directory, and the installed worker polls the sandbox Temporal and reports it on /readyz."""

from __future__ import annotations

import json
import signal
import subprocess
import time
import urllib.error
import urllib.request
import uuid
import zipfile

import pytest

from sandbox.temporal_server import free_port
from tests.deploy.wheel_venv import ROOT, WheelVenv, build_wheel_venv, minimal_config

SERVICE_PACKAGES = ("domain", "clients", "activities", "workflows", "runtime")


@pytest.fixture(scope="session")
def wheel_venv(tmp_path_factory) -> WheelVenv:
    return build_wheel_venv(tmp_path_factory.mktemp("wheel"))


def test_wheel_holds_every_service_package_and_module(wheel_venv):
    names = set(zipfile.ZipFile(wheel_venv.wheel).namelist())
    packages = {str(p.parent.relative_to(ROOT)) for top in SERVICE_PACKAGES for p in (ROOT / top).rglob("__init__.py")
                if "__pycache__" not in p.parts}
    assert "runtime" in packages and "domain/contract" in packages
    missing = sorted(p for p in packages if f"{p}/__init__.py" not in names)
    assert not missing, f"packages left out of the wheel: {missing}"
    modules = {str(p.relative_to(ROOT)) for top in SERVICE_PACKAGES for p in (ROOT / top).rglob("*.py")
               if "__pycache__" not in p.parts}
    assert not sorted(modules - names), f"modules left out of the wheel: {sorted(modules - names)}"
    assert {"worker.py", "starter.py"} <= names
    entry_points = next(n for n in names if n.endswith("entry_points.txt"))
    text = zipfile.ZipFile(wheel_venv.wheel).read(entry_points).decode()
    assert "gpu-rl-builder = starter:main" in text and "gpu-rl-builder-worker = worker:main" in text


@pytest.mark.parametrize("command", ["gpu-rl-builder", "gpu-rl-builder-worker"])
def test_entry_points_help_from_an_empty_directory(wheel_venv, command):
    out = wheel_venv.run(str(wheel_venv.bin / command), "--help")
    assert out.returncode == 0, out.stderr
    for flag in ("--config", "--address", "--namespace", "--profile"):
        assert flag in out.stdout, f"{command} --help lacks {flag}"
    # The installed code runs, not the source folder's.
    where = wheel_venv.run(str(wheel_venv.bin / "python"), "-c", "import runtime, worker; print(runtime.__file__)")
    assert where.returncode == 0 and str(wheel_venv.prefix) in where.stdout, where.stderr


def _get(url: str) -> tuple[int, dict]:
    try:
        with urllib.request.urlopen(url, timeout=5) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read() or b"{}")


def test_installed_worker_polls_the_sandbox_temporal_and_stops_on_sigterm(wheel_venv, temporal_dev_server, tmp_path):
    task_queue = f"wheel-{uuid.uuid4().hex[:8]}"
    health_port = free_port()
    proc = subprocess.Popen(
        [str(wheel_venv.bin / "gpu-rl-builder-worker"), "--config", str(minimal_config(tmp_path, task_queue)),
         "--address", temporal_dev_server.address, "--health", f"127.0.0.1:{health_port}",
         "--graceful-shutdown", "5"],
        cwd=wheel_venv.workdir, env=wheel_venv.env(TEMPORAL_NAMESPACE=temporal_dev_server.namespace),
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)
    try:
        deadline, status, body = time.monotonic() + 90, 0, {}
        while time.monotonic() < deadline and proc.poll() is None:
            try:
                status, body = _get(f"http://127.0.0.1:{health_port}/readyz")
            except (urllib.error.URLError, ConnectionError):
                status = 0
            if status == 200:
                break
            time.sleep(0.5)
        assert proc.poll() is None, proc.stdout.read()
        assert status == 200, body
        assert body["temporal"]["reachable"] and body["pollers"] == {"workflow": True, "activity": True}
        assert body["task_queue"] == task_queue and body["identity"].startswith("gpu-rl-builder@")
        assert _get(f"http://127.0.0.1:{health_port}/livez")[0] == 200
        proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=60)
        assert proc.returncode == 0, out
        assert "worker stopped" in out and f"namespace={temporal_dev_server.namespace}" in out
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
