"""A real marin-iris controller (0.2.227) in local mode, run as a subprocess for tests and the sandbox.

Why a subprocess: the local cluster runs its workers as threads and every task as a host
subprocess; keeping all of that out of the test process lets ``stop()`` kill it as a unit and lets
tests simulate a controller crash and restart on the same state directory.

What the local controller advertises: the wheel's ``local.yaml`` reshaped like the CoreWeave pools
(``_shape_like_coreweave``): scale group ``cpu`` (128 CPU, 2014 GiB RAM, 2 TiB disk) and ``gb200``
(4 x GB200, 144 CPU, 955 GiB RAM), up to 4 workers each
(slices); no GPU/TPU scale group, so a GPU request is rejected at LaunchJob with
``failed_precondition``. Tasks run as host processes whose cwd is ``<state_dir>/cwd`` (the
controller's cwd), not the bundle: the bundle is unpacked in ``$IRIS_WORKDIR``. ``setup_commands``
are skipped in local mode.

The client-freshness gate stays ON: ``LaunchJob`` rejects a root job whose
``client_revision_date`` is more than 14 days older than the controller's own build date. Our client
sends the build date of the marin-iris it was tested against (clients/iris_pin.py).

State (SQLite DB, bundle store, temp dirs, the auto-login token file under a private HOME) lives
under ``state_dir``, so starting again on the same directory restores the controller's job table.

Ready means ready for what the tests do with it: ``start_iris_controller`` returns only once this very
process printed its start line (so the port is bound by it: marin-iris's public listener binds
exclusively) and ``/health`` and the log server behind ``/proxy/system.log-server`` both answer
(``IrisControllerHandle.check``). A start that fails kills the whole process (see ``_serve``).

Everything the controller prints (its stdout and stderr, its Python tracebacks) goes to
``<state_dir>/controller-<ms>.log``; every error here names that file.

Run directly: ``python -m sandbox.iris_controller --state-dir DIR [--port N]`` (blocks).
"""

from __future__ import annotations

import argparse
import atexit
import logging
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import traceback
import uuid
from dataclasses import dataclass, field
from pathlib import Path

import httpx

REPO_ROOT = Path(__file__).resolve().parents[1]
MARKER_ENV = "GPU_RL_BUILDER_IRIS_CONTROLLER_ID"  # inherited by every task: used to sweep survivors
STARTED_LINE = "Controller started at "  # printed by ``_serve`` only after the cluster started in this process
START_FAILED_EXIT = 3  # ``_serve``'s exit code when the cluster did not start (the traceback is in the log)


class IrisControllerError(RuntimeError):
    """The controller did not come up (the message carries the tail of its log)."""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _processes_with_marker(marker: str) -> list[int]:
    """PIDs of our own processes whose environment carries ``MARKER_ENV=marker``."""
    needle = f"{MARKER_ENV}={marker}".encode()
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            with open(f"/proc/{entry}/environ", "rb") as f:
                if needle in f.read().split(b"\0"):
                    found.append(int(entry))
        except OSError:
            continue
    return found


def _kill_all(pids: list[int]) -> None:
    groups = set()
    for pid in pids:
        try:
            groups.add(os.getpgid(pid))
        except ProcessLookupError:
            continue
    for pgid in groups:
        try:
            os.killpg(pgid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass


@dataclass
class IrisControllerHandle:
    """A running controller subprocess; ``stop()`` is idempotent and also registered with atexit."""

    url: str
    port: int
    pid: int
    state_dir: Path
    marker: str
    log_path: Path
    _proc: subprocess.Popen = field(repr=False)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)
    _stopped: bool = False

    def stop(self, grace_s: float = 5.0) -> None:
        """Kill the controller, its process group and every task it spawned (tasks run in their own
        sessions, so they are found by the marker env var they inherit, not by process group)."""
        with self._lock:
            if self._stopped:
                return
            self._stopped = True
        try:
            os.kill(self.pid, signal.SIGSTOP)  # freeze: no new tasks are spawned while we sweep
        except ProcessLookupError:
            pass
        tasks = [p for p in _processes_with_marker(self.marker) if p != self.pid]
        _kill_all(tasks)
        try:
            os.killpg(self.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        try:
            self._proc.wait(timeout=grace_s)
        except subprocess.TimeoutExpired:
            pass
        deadline = time.monotonic() + grace_s
        while (left := _processes_with_marker(self.marker)) and time.monotonic() < deadline:
            _kill_all(left)
            time.sleep(0.1)
        atexit.unregister(self.stop)

    @property
    def alive(self) -> bool:
        return not self._stopped and self._proc.poll() is None

    def check(self, timeout_s: float = 10.0) -> str | None:
        """None when this controller is usable: its process runs, ``/health`` answers ok and its log server
        answers ``FetchLogs`` through the endpoint proxy (what every log read of the client goes through,
        clients/iris.py ``LOG_SERVER_PROXY_PREFIX``). Otherwise what is wrong, naming the controller's log."""
        from clients.iris import LOG_SERVER_PROXY_PREFIX, LOG_SERVICE

        where = f"controller pid {self.pid} at {self.url}; its log: {self.log_path}"
        if self._stopped:
            return f"the controller was stopped ({where})"
        if (rc := self._proc.poll()) is not None:
            return f"the controller exited with {rc} ({where}):\n{_tail(self.log_path)}"
        try:
            r = httpx.get(f"{self.url}/health", timeout=timeout_s)
            if r.status_code != 200 or r.json().get("status") != "ok":
                return f"GET /health answered HTTP {r.status_code} {r.text[:200]!r} ({where})"
            path = f"{LOG_SERVER_PROXY_PREFIX}/{LOG_SERVICE}/FetchLogs"
            r = httpx.post(f"{self.url}{path}", timeout=timeout_s,
                           json={"source": "/gpu-rl-builder-probe/", "matchScope": "MATCH_SCOPE_PREFIX", "maxLines": 1})
        except (httpx.HTTPError, ValueError) as e:
            return f"the controller does not answer ({type(e).__name__}: {e}) ({where})"
        if r.status_code != 200:
            return (f"the controller's log server does not answer through the endpoint proxy: POST {path} -> "
                    f"HTTP {r.status_code} {r.text[:200]!r}; every log read fails until it does ({where})")
        return None


def start_iris_controller(state_dir: Path, **kw) -> IrisControllerHandle:
    """Start a local controller; a free port taken by someone else before the controller binds it is
    retried with a fresh port (only when the caller did not pin ``port``)."""
    attempts = 1 if kw.get("port") else 3
    for attempt in range(attempts):
        try:
            return _start_once(state_dir, **kw)
        except IrisControllerError as e:
            if "address already in use" not in str(e).lower() or attempt + 1 == attempts:
                raise
    raise AssertionError("unreachable")


def _start_once(
    state_dir: Path, *, port: int | None = None, startup_timeout_s: float = 90.0,
    timeout_scan_interval_s: float | None = None,
) -> IrisControllerHandle:
    """Start a local controller on 127.0.0.1 (a free port unless ``port`` is given, e.g. to restart on
    the same URL) with its state under ``state_dir``; return once ``GET /health`` answers ok.

    ``timeout_scan_interval_s``: the controller checks per-task execution timeouts only every 60 s; tests
    may shorten that scan (the only behaviour changed; None keeps the controller's own 60 s)."""
    state_dir = Path(state_dir).resolve()
    for sub in ("home", "tmp", "cwd"):
        (state_dir / sub).mkdir(parents=True, exist_ok=True)
    port = port or free_port()
    marker = uuid.uuid4().hex
    env = {
        **os.environ,
        "HOME": str(state_dir / "home"),
        "TMPDIR": str(state_dir / "tmp"),
        "PYTHONPATH": str(REPO_ROOT),
        "PYTHONUNBUFFERED": "1",
        MARKER_ENV: marker,
    }
    log_path = state_dir / f"controller-{int(time.time() * 1000)}.log"
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "sandbox.iris_controller", "--state-dir", str(state_dir), "--port", str(port),
             *(["--timeout-scan-interval", str(timeout_scan_interval_s)] if timeout_scan_interval_s else [])],
            cwd=state_dir / "cwd",
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    handle = IrisControllerHandle(
        url=f"http://127.0.0.1:{port}", port=port, pid=proc.pid, state_dir=state_dir, marker=marker,
        log_path=log_path, _proc=proc,
    )
    atexit.register(handle.stop)
    # Not ``/health`` alone: whoever holds the port answers it. When another process took the port between
    # ``free_port()`` and the bind (another controller's private listener did, once, in a two-worker CI run),
    # that process answered /health "ok", this controller failed to bind and every log read of the session
    # got 404 from the impostor. Only this process's own start line proves it holds the port.
    deadline = time.monotonic() + startup_timeout_s
    started, problem = False, "it has not printed its start line yet"
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            handle.stop()
            raise IrisControllerError(f"controller exited with {proc.returncode} (log {log_path}): {_tail(log_path)}")
        started = started or f"{STARTED_LINE}{handle.url}" in _read(log_path)
        if started and (problem := handle.check(timeout_s=5.0)) is None:
            return handle
        time.sleep(0.2)
    handle.stop()
    raise IrisControllerError(f"controller not ready after {startup_timeout_s}s: {problem}\n{_tail(log_path)}")


def _read(path: Path) -> str:
    try:
        return path.read_text(errors="replace")
    except OSError:
        return ""


def _tail(path: Path, n: int = 20) -> str:
    return "\n".join(_read(path).splitlines()[-n:]) or "(no log)"


def _serve(state_dir: Path, port: int, timeout_scan_interval_s: float | None = None) -> None:
    """Subprocess body: build the local cluster with its DB, log server and bundle store under state_dir.

    0.2.227 moved the local cluster to ``iris.cluster.local_cluster.LocalCluster`` and its config to
    ``iris/config/examples/local.yaml`` (a pydantic ``IrisClusterConfig`` loaded by ``load_config``)."""
    from importlib.resources import files

    from iris.cluster.config import load_config, make_local_config
    from iris.cluster.local_cluster import LocalCluster
    from rigging.log_setup import configure_logging

    # As the controller's own entry points do (iris/cluster/controller/main.py:419 ``serve``, iris/cli/main.py:73
    # for ``iris cluster start --local``): without it the root logger stays at WARNING, and the controller's INFO
    # lines (its audit lines of job transitions, iris/cluster/controller/audit_logging.py) never reach the log
    # server's /system/controller key (controller.py:492-496), unlike on a real cluster.
    configure_logging(level=logging.INFO)

    config = make_local_config(load_config(str(files("iris") / "config" / "examples" / "local.yaml")))
    config.controller.local.port = port
    _shape_like_coreweave(config)
    bundles = state_dir / "bundles"
    bundles.mkdir(exist_ok=True)
    config.storage.remote_state_dir = f"file://{bundles}"

    class _Dir:  # stands in for the TemporaryDirectory LocalCluster keeps its DB and log server in
        name = str(state_dir / "db")

        def cleanup(self) -> None:
            pass

    Path(_Dir.name).mkdir(exist_ok=True)
    cluster = LocalCluster(config)
    cluster._db_dir.cleanup()  # noqa: SLF001 - the temporary one it made; ours survives a restart
    cluster._db_dir = _Dir()  # noqa: SLF001 - keep the DB (and logs) in state_dir so a restart restores it
    try:
        url = cluster.start()
    except BaseException:
        # ``start()`` has already spawned non-daemon threads (RPC server, control loop, log server, workers):
        # a plain raise would leave this process running without its public listener, looking alive to the
        # parent. Exit at once instead; the parent reads the traceback from the log (and, for a port taken
        # meanwhile, retries on a fresh one).
        traceback.print_exc()
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(START_FAILED_EXIT)
    if timeout_scan_interval_s:
        from rigging.timing import RateLimiter

        cluster._controller._timeout_rate_limiter = RateLimiter(interval_seconds=timeout_scan_interval_s)  # noqa: SLF001
    print(f"{STARTED_LINE}{url}", flush=True)

    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    stop.wait()
    cluster.stop()


def _shape_like_coreweave(config) -> None:
    """Advertise node shapes like the CoreWeave pools the ops templates target.

    The local scheduler believes the config's worker sizes (tasks are host processes either way), so
    the real launch templates (48 CPU / 512 GB on amd64; GB200x1 / 96 CPU / 640 GB on arm64) schedule
    here unchanged instead of the service shrinking real requests for the sandbox."""
    from iris.cluster.config import ScaleGroupConfig

    base = config.scale_groups["cpu"].model_dump(exclude_none=True)
    base.pop("resources", None)
    shapes = {
        "cpu": {"cpu_millicores": 128_000, "memory_bytes": 2014 * 2**30, "disk_bytes": 2 * 2**40,
                "device_type": "cpu", "device_variant": "cpu"},
        "gb200": {"cpu_millicores": 144_000, "memory_bytes": 955 * 2**30, "disk_bytes": 2 * 2**40,
                  "device_type": "gpu", "device_variant": "GB200", "device_count": 4},
    }
    capacity = config.scale_groups["cpu"].resources.capacity_type
    config.scale_groups = {
        name: ScaleGroupConfig.model_validate(
            {**base, "name": name, "resources": {**res, "capacity_type": capacity}})
        for name, res in shapes.items()
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--state-dir", type=Path, required=True)
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--timeout-scan-interval", type=float, default=None)
    args = parser.parse_args()
    _serve(args.state_dir.resolve(), args.port or free_port(), args.timeout_scan_interval)


if __name__ == "__main__":
    main()
