"""A controller is handed out only when it is the one answering on its port, with its log server reachable.

The CI flake this pins down (two xdist workers starting their session controllers at the same moment): worker B
chose a free port, and before its controller bound it, worker A's controller bound that very port for its
private (Python) listener. B's controller failed to bind its public listener, but the threads it had
started kept its process alive; the readiness check (``GET /health``) was answered "ok" by A's private
listener, so B's whole session ran against it: job RPCs worked (the private listener serves them) and every
log read (``/proxy/system.log-server/...``, served only by the public listener) got HTTP 404. Here the port
is held by a real controller's private listener, found from ``/proc``.
"""

from __future__ import annotations

import dataclasses
import os
import signal
from pathlib import Path

import httpx
import pytest

import sandbox.iris_controller as ic
from sandbox.iris_controller import IrisControllerError, start_iris_controller
from sandbox.ports import listening_ports
from tests.iris.helpers import LOG_PROXY_PATH, private_listener

pytestmark = pytest.mark.stack


def test_a_port_held_by_another_controllers_private_listener_is_refused_not_handed_out(iris_controller, tmp_path):
    taken = private_listener(iris_controller)
    with pytest.raises(IrisControllerError) as err:
        start_iris_controller(tmp_path / "ctl", port=taken, startup_timeout_s=60)
    message = str(err.value)
    assert "address already in use" in message.lower() and str(tmp_path / "ctl") in message
    assert not _pids_under(tmp_path / "ctl")  # no half-started controller left behind


def _pids_under(state_dir: Path) -> set[int]:
    """PIDs whose command line names ``state_dir`` (the controller subprocess of that state dir)."""
    found = set()
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if str(state_dir).encode() in (entry / "cmdline").read_bytes():
                    found.add(int(entry.name))
            except OSError:
                continue
    return found


def test_a_free_port_taken_before_the_bind_is_retried_on_a_fresh_one(iris_controller, tmp_path, monkeypatch):
    taken = private_listener(iris_controller)
    chosen = iter([taken])
    real_free_port = ic.free_port
    monkeypatch.setattr(ic, "free_port", lambda: next(chosen, None) or real_free_port())
    handle = start_iris_controller(tmp_path / "ctl", startup_timeout_s=120)
    try:
        assert handle.port != taken
        assert handle.port in listening_ports(handle.pid)  # this process holds its own port
        assert handle.check() is None
        r = httpx.post(f"{handle.url}{LOG_PROXY_PATH}", json={"source": "/", "matchScope": "MATCH_SCOPE_PREFIX"},
                       timeout=10.0)
        assert r.status_code == 200, r.text
        failed_logs = [p for p in (tmp_path / "ctl").glob("controller-*.log") if "already in use" in p.read_text()]
        assert len(failed_logs) == 1  # the first attempt's log is kept, with the bind error in it
    finally:
        handle.stop()
    problem = handle.check()
    assert problem is not None and "stopped" in problem and str(handle.log_path) in problem


def test_check_names_what_broke_and_the_controllers_log(iris_controller, tmp_path):
    # Its log server unreachable through the proxy: what the tests saw as a bare 404 on every log read.
    impostor = dataclasses.replace(iris_controller, url=f"http://127.0.0.1:{private_listener(iris_controller)}")
    problem = impostor.check()
    assert problem is not None
    assert "log server does not answer through the endpoint proxy" in problem and "HTTP 404" in problem
    assert str(iris_controller.log_path) in problem
    # Its process dead.
    handle = start_iris_controller(tmp_path / "ctl", startup_timeout_s=120)
    try:
        os.kill(handle.pid, signal.SIGKILL)
        handle._proc.wait(timeout=30)
        problem = handle.check()
        assert problem is not None and "exited with -9" in problem and str(handle.log_path) in problem
    finally:
        handle.stop()
