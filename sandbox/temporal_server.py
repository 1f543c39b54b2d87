"""A real Temporal dev server (``temporal server start-dev``) for the sandbox and the tests.

Why the CLI binary rather than ``WorkflowEnvironment.start_local``: the stack must outlive one Python
process (``python -m sandbox up``), persist to SQLite so workflows survive a server restart, and be
stoppable by process group from another process (``python -m sandbox down``).
"""

from __future__ import annotations

import atexit
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from sandbox.ports import listening_ports

# The project's search attributes; every server the project talks to must know them.
SEARCH_ATTRIBUTES: dict[str, str] = {
    "BuildSourceCommit": "Keyword",
    "BuildHarborCommit": "Keyword",
    "BuildArchitecture": "Keyword",
    "BuildVariant": "Keyword",
    "BuildStage": "Keyword",
    "BuildFailureClass": "Keyword",
    "BuildKind": "Keyword",
}

HOST = "127.0.0.1"


class TemporalServerError(RuntimeError):
    """The dev server could not be found or did not come up."""


def free_port() -> int:
    """A loopback port that was free a moment ago (the OS picks it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((HOST, 0))
        return s.getsockname()[1]


def find_binary(name: str) -> str:
    """A console binary installed next to this interpreter (the venv), else on PATH."""
    beside = Path(sys.executable).parent / name
    if beside.is_file() and os.access(beside, os.X_OK):
        return str(beside)
    found = shutil.which(name)
    if not found:
        raise TemporalServerError(f"{name!r} binary not found next to {sys.executable} or on PATH")
    return found


def stop_process_group(proc: subprocess.Popen | None, timeout: float = 10.0) -> None:
    """SIGTERM the process group, then SIGKILL it if it lingers; safe to call twice."""
    if proc is None:
        return
    if proc.poll() is None:
        try:
            os.killpg(proc.pid, signal.SIGTERM)
        except ProcessLookupError:
            pass
        try:
            proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            pass
    # Kill any stragglers in the group even when the leader already exited.
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    if proc.poll() is None:
        proc.wait(timeout=timeout)


@dataclass
class TemporalDevServer:
    """A running dev server; ``stop()`` is idempotent and also runs at interpreter exit."""

    address: str
    ui_url: str | None
    namespace: str
    db_path: Path
    log_path: Path
    process: subprocess.Popen = field(repr=False)

    @property
    def pid(self) -> int:
        return self.process.pid

    def stop(self) -> None:
        stop_process_group(self.process)
        atexit.unregister(self.stop)


def _wait_ready(proc: subprocess.Popen, address: str, binary: str, log_path: Path, timeout: float) -> None:
    """Poll ``temporal operator cluster health`` until the frontend answers SERVING, once this very process
    listens on the port: a port taken by another server between choosing and binding (another Temporal dev
    server answered SERVING on it while this one failed to bind) is not a ready server but a failed start."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            tail = log_path.read_text(errors="replace")[-2000:]
            raise TemporalServerError(f"temporal dev server exited with {proc.returncode} (log {log_path}): {tail}")
        host, port = address.rsplit(":", 1)
        if int(port) not in listening_ports(proc.pid):
            time.sleep(0.1)
            continue
        try:
            with socket.create_connection((host, int(port)), timeout=0.5):
                pass
        except OSError:
            time.sleep(0.1)
            continue
        res = subprocess.run(
            [binary, "operator", "cluster", "health", "--address", address],
            capture_output=True,
            text=True,
            timeout=10,
        )
        if res.returncode == 0 and "SERVING" in res.stdout:
            return
        time.sleep(0.2)
    raise TemporalServerError(f"temporal dev server at {address} not ready after {timeout:.0f}s")


def start_temporal_dev_server(state_dir: Path, **kw) -> TemporalDevServer:
    """Start ``temporal server start-dev`` on loopback with its SQLite file in ``state_dir``.

    A free port can be taken by someone else between choosing it and the server binding it; when the
    ports were chosen here (not pinned by the caller) that race is retried with fresh ports."""
    attempts = 1 if kw.get("port") or kw.get("ui_port") else 3
    for attempt in range(attempts):
        try:
            return _start_once(state_dir, **kw)
        except TemporalServerError as e:
            if "address already in use" not in str(e) or attempt + 1 == attempts:
                raise
    raise AssertionError("unreachable")


def _start_once(
    state_dir: Path,
    *,
    ui: bool = True,
    search_attributes: dict[str, str] = SEARCH_ATTRIBUTES,
    namespace: str = "default",
    port: int | None = None,
    ui_port: int | None = None,
    ready_timeout: float = 60.0,
) -> TemporalDevServer:
    """One start attempt. ``port`` may be fixed to restart a server on the same address (crash tests); by default free
    ports are chosen at run time.
    """
    state_dir = Path(state_dir)
    state_dir.mkdir(parents=True, exist_ok=True)
    binary = find_binary("temporal")
    port = port or free_port()
    db_path = state_dir / "temporal.db"
    log_path = state_dir / "temporal.log"
    argv = [
        binary, "server", "start-dev",
        "--ip", HOST,
        "--port", str(port),
        "--db-filename", str(db_path),
        "--log-level", "warn",
        "--http-port", str(free_port()),
        "--metrics-port", str(free_port()),
    ]
    if namespace != "default":
        argv += ["--namespace", namespace]
    ui_url = None
    if ui:
        ui_port = ui_port or free_port()
        argv += ["--ui-port", str(ui_port), "--ui-disable-news-fetch"]
        ui_url = f"http://{HOST}:{ui_port}"
    else:
        argv.append("--headless")
    for name, kind in search_attributes.items():
        argv += ["--search-attribute", f"{name}={kind}"]
    log = open(log_path, "ab")  # noqa: SIM115 - handed to the child; closed below
    try:
        proc = subprocess.Popen(
            argv, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True
        )
    finally:
        log.close()
    address = f"{HOST}:{port}"
    server = TemporalDevServer(
        address=address, ui_url=ui_url, namespace=namespace, db_path=db_path, log_path=log_path, process=proc
    )
    atexit.register(server.stop)
    try:
        _wait_ready(proc, address, binary, log_path, ready_timeout)
    except BaseException:
        server.stop()
        raise
    return server
