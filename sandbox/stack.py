"""The whole local sandbox: Temporal, an Iris controller, two registries, git remotes, GitHub stand-in.

Why one object: the service reads a single ``config.toml``; the stack starts every real service and
stand-in on loopback with run-time ports, writes that file (no secrets inside, only where to read
them) plus ``stack.json`` (endpoints and pids, for ``python -m sandbox down``), and stops everything
it started, process groups included, even when start fails half-way.
"""

from __future__ import annotations

import atexit
import importlib
import json
import os
import shutil
import signal
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from sandbox.git_remotes import SeededRemotes, seed_remotes
from sandbox.temporal_server import start_temporal_dev_server

IMAGE_REPO_PATH = "marin-community/marinskyrl"
MARINSKYRL_SLUG = "marin-community/MarinSkyRL"
HARBOR_SLUG = "marin-community/harbor"


class StackError(RuntimeError):
    """A sandbox component is missing or failed to start."""


def _import(module: str, attr: str) -> Callable[..., Any]:
    """Import another helper's module lazily so a missing one names itself clearly."""
    try:
        return getattr(importlib.import_module(module), attr)
    except (ImportError, AttributeError) as e:
        raise StackError(f"sandbox component {module}.{attr} is not available: {e}") from e


def _write_secret(path: Path, value: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as fh:
        fh.write(value)
    path.chmod(0o600)


def _toml_value(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int | float):
        return repr(v)
    if isinstance(v, str):
        return json.dumps(v)  # a JSON string is a valid TOML basic string
    if isinstance(v, list | tuple):
        return "[" + ", ".join(_toml_value(x) for x in v) + "]"
    if isinstance(v, dict):
        return "{" + ", ".join(f"{json.dumps(k)} = {_toml_value(x)}" for k, x in v.items()) + "}"
    raise TypeError(f"cannot write {type(v).__name__} to TOML")


INLINE_TABLES = {"user", "token", "api_key", "job_env", "rehearsal_registry_mirrors"}  # sources, env and host maps


def to_toml(data: dict[str, Any], prefix: str = "") -> str:
    """Enough TOML for ServiceConfig: scalars and inline tables first, then ``[a.b]`` sections."""
    section = [k for k, v in data.items() if isinstance(v, dict) and k not in INLINE_TABLES]
    out = "".join(f"{k} = {_toml_value(v)}\n" for k, v in data.items() if k not in section and v is not None)
    for k in section:
        name = f"{prefix}.{k}" if prefix else k
        out += f"\n[{name}]\n" + to_toml(data[k], name)
    return out


class SandboxStack:
    """Start with ``start()`` (or ``with SandboxStack(dir) as s``); ``stop()`` is idempotent."""

    def __init__(self, state_dir: Path, *, github: bool = True, auto_green: bool = False) -> None:
        self.state_dir = Path(state_dir).resolve()
        self.want_github = github
        # The GitHub stand-in reports a green "ci" check run on every head nobody set checks on, the way a
        # real repository's CI reports on a pushed head (scripts/sandbox-build's kept stack).
        self.auto_green = auto_green
        self.temporal = None
        self.iris = None
        self.open_registry = None
        self.token_registry = None
        self.github = None
        self.remotes: SeededRemotes | None = None
        self._stops: list[tuple[str, Callable[[], None]]] = []

    @property
    def config_path(self) -> Path:
        return self.state_dir / "config.toml"

    @property
    def stack_json(self) -> Path:
        return self.state_dir / "stack.json"

    def __enter__(self) -> SandboxStack:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def start(self) -> SandboxStack:
        self.state_dir.mkdir(parents=True, exist_ok=True)
        atexit.register(self.stop)
        try:
            self._start_all()
        except BaseException:
            self.stop()
            raise
        return self

    def _start_all(self) -> None:
        start_iris_controller = _import("sandbox.iris_controller", "start_iris_controller")
        start_registry = _import("sandbox.registry", "start_registry")

        self.temporal = start_temporal_dev_server(self.state_dir / "temporal", ui=True)
        self._stops.append(("temporal", self.temporal.stop))
        self.iris = start_iris_controller(self.state_dir / "iris")
        self._stops.append(("iris", self.iris.stop))
        self.open_registry = start_registry(self.state_dir / "registry-open", "open")
        self._stops.append(("registry-open", self.open_registry.stop))
        self.token_registry = start_registry(self.state_dir / "registry-token", "token")
        self._stops.append(("registry-token", self.token_registry.stop))
        self.remotes = self._seed_or_load_remotes()
        if self.want_github:
            self._start_github()
        self._write_config()
        self._write_stack_json()

    def _seed_or_load_remotes(self) -> SeededRemotes:
        saved = self.state_dir / "remotes.json"
        if saved.exists() and (self.state_dir / "remotes" / "harbor.git").exists():
            return SeededRemotes.model_validate_json(saved.read_text())
        remotes = seed_remotes(self.state_dir / "remotes")
        saved.write_text(remotes.model_dump_json(indent=2))
        return remotes

    def _start_github(self) -> None:
        try:
            module = importlib.import_module("sandbox.github_standin")
        except ImportError:
            return  # the seam: no GitHub stand-in yet, so no [github] settings
        assert self.remotes is not None
        remotes = {
            MARINSKYRL_SLUG: self.remotes.marinskyrl_url.removeprefix("file://"),
            HARBOR_SLUG: self.remotes.harbor_url.removeprefix("file://"),
        }
        self.github = module.start_github_standin(self.state_dir / "github", remotes, auto_green=self.auto_green)
        self._stops.append(("github", self.github.stop))

    def _write_config(self) -> None:
        assert self.temporal and self.iris and self.token_registry and self.open_registry and self.remotes
        write_service_config(self.config_path, self.state_dir, temporal=self.temporal, iris=self.iris,
                             token_registry=self.token_registry, open_registry=self.open_registry,
                             remotes=self.remotes, github=self.github)

    def endpoints(self) -> dict[str, Any]:
        """Endpoints and pids (no secrets): what ``stack.json`` holds and ``up`` prints."""
        t, i, o, k, g = self.temporal, self.iris, self.open_registry, self.token_registry, self.github
        return {
            "state_dir": str(self.state_dir),
            "config": str(self.config_path),
            "supervisor_pid": os.getpid(),
            "temporal": t and {"address": t.address, "ui_url": t.ui_url, "namespace": t.namespace, "pid": t.pid},
            "iris": i and {"url": i.url, "pid": i.pid, "marker": i.marker},
            "registry_open": o and {"url": o.url, "host": o.host, "pid": o.pid},
            "registry_token": k and {"url": k.url, "host": k.host, "pid": k.pid, "token_url": k.token_url,
                                     "admin_url": k.admin_url, "push_user": k.push_user},
            "github": g and {"api_url": g.api_url, "pid": getattr(g, "pid", None)},
            "remotes": self.remotes and self.remotes.model_dump(mode="json"),
        }

    def _write_stack_json(self) -> None:
        self.stack_json.write_text(json.dumps(self.endpoints(), indent=2))

    def stop(self) -> None:
        """Stop everything started, newest first; keep going past individual failures."""
        errors = []
        while self._stops:
            name, stop = self._stops.pop()
            try:
                stop()
            except Exception as e:  # noqa: BLE001 - report after stopping the rest
                errors.append(f"{name}: {e}")
        atexit.unregister(self.stop)
        if errors:
            raise StackError("; ".join(errors))

    def pids(self) -> list[int]:
        return [p for p in (getattr(x, "pid", None) for x in (
            self.temporal, self.iris, self.open_registry, self.token_registry, self.github)) if p]


SANDBOX_OPERATORS = ("tester", "sandbox-operator", "kill-matrix", "bench-operator")


def write_service_config(path: Path, state_dir: Path, *, temporal, iris, token_registry, open_registry, remotes,
                         github=None, task_queue: str = "gpu-rl-builder", policy: dict[str, Any] | None = None) -> Path:
    """The service configuration for these sandbox parts (``domain.config.ServiceConfig`` as TOML).

    Secrets go to 0600 files under ``state_dir/secrets`` and the config names those files. ``policy``
    overrides single ``[policy]`` settings (the test suite's faster PR watch)."""
    token_file = state_dir / "secrets" / "registry-token"
    _write_secret(token_file, token_registry.push_token or "")
    # The rehearsal's task image (ubuntu:22.04) comes from the open registry, the sandbox's docker.io
    # mirror, holding the stand-in (sandbox/task_image.py); unpacked once per registry (by digest).
    mirrors = _task_image_mirror(open_registry)
    cluster = {"controller_url": iris.url, "iris_user": "gpu-rl-builder",  # the client's own revision date
               # The local controller runs tasks on the host: the job that runs a built image's own checks
               # gets the image laid out first by the sandbox's stand-in for a container runtime.
               "image_check_runner": [shutil.which("python3") or "/usr/bin/python3",
                                      str(Path(__file__).resolve().parent / "image_run_standin.py")]}
    config: dict[str, Any] = {
        "work_dir": str(state_dir / "work"),
        # Outside work_dir on purpose: the store stands for a bucket that outlives the worker's disk.
        "evidence": {"url": str(state_dir / "evidence")},
        "temporal": {"address": temporal.address, "namespace": temporal.namespace, "task_queue": task_queue,
                     **({"ui_url": temporal.ui_url} if temporal.ui_url else {})},
        "repos": {"marinskyrl_url": remotes.marinskyrl_url, "harbor_url": remotes.harbor_url,
                  "marinskyrl_slug": MARINSKYRL_SLUG, "harbor_slug": HARBOR_SLUG},
        "clusters": {
            "sandbox-amd64": {**cluster, "architecture": "amd64"},
            "sandbox-arm64": {**cluster, "architecture": "arm64", "job_env": {"SANDBOX_UNAME_M": "aarch64"}},
        },
        "registry": {
            "image_repository": f"{token_registry.host}/{IMAGE_REPO_PATH}",
            "insecure_hosts": [token_registry.host, open_registry.host],
            "user": {"kind": "literal_public", "value": token_registry.push_user},
            "token": {"kind": "file", "path": str(token_file)},
        },
        # What a plan uses when the commit's ops doc does not state it (the sandbox's own clusters).
        "build": {"architectures": {
            "amd64": {"cluster": "sandbox-amd64", "cpu": 48, "memory": "512GB", "disk": "400GB", "max_retries": 0,
                      "timeout_s": 18000},
            "arm64": {"cluster": "sandbox-arm64", "gpu": "GB200x1", "cpu": 96, "memory": "640GB", "disk": "500GB",
                      "max_retries": 3, "timeout_s": 28800},
        }},
        # Short timers so the sandbox and tests see progress and re-checks quickly.
        "policy": {"progress_interval_s": 5.0, "poll_min_interval_s": 0.5, "poll_max_interval_s": 3.0,
                   "visibility_recheck_interval_s": 60, "watch_interval_s": 1.0, "watch_progress_interval_s": 5.0,
                   "watch_follow_interval_s": 2.0, "watch_signal_progress_s": 30.0, "watch_fast_interval_s": 0.5,
                   "watch_idle_interval_s": 1.0, "watch_status_budget_per_min": 90, "watch_log_interval_s": 2.0,
                   "monitor_safety_interval_s": 120, "rehearsal_registry_mirrors": mirrors,
                   "rehearsal_image_cache_dir": str(Path(open_registry.state_dir) / "rehearsal-images"),
                   **(policy or {})},
    }
    if github is not None:
        gh_token = state_dir / "secrets" / "github-token"
        _write_secret(gh_token, github.token)
        # The stand-in plays github.com: issue links (--issue-url) name github.com.
        config["github"] = {"api_url": github.api_url, "web_url": "https://github.com",
                            "token": {"kind": "file", "path": str(gh_token)}}
    # Who may approve merges and decide in the sandbox (the names its demo, tests and benches use).
    config["operators"] = {"logins": list(SANDBOX_OPERATORS)}
    (state_dir / "work").mkdir(parents=True, exist_ok=True)
    path.write_text(to_toml(config))
    from domain.config import load_config

    load_config(path)  # fail now, not in the worker, if the file does not validate
    return path


_PUSHED: set[str] = set()


def _task_image_mirror(open_registry) -> dict[str, str]:
    """Push the stand-in task image and the stand-in base images (sandbox/base_images.py: what the builds'
    FROMs and crane reads name, looked up before submission) to ``open_registry`` (once per registry and
    process); the mirror map (docker.io, gcr.io -> the open registry)."""
    from sandbox.base_images import STANDIN_BASES, push_base_images
    from sandbox.task_image import mirrors_for, push_task_image

    if open_registry.host not in _PUSHED:
        push_task_image(open_registry.host)
        push_base_images(open_registry.host)
        _PUSHED.add(open_registry.host)
    return {**{registry: open_registry.host for registry, _, _ in STANDIN_BASES}, **mirrors_for(open_registry.host)}


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:  # a zombie is as good as gone
        return Path(f"/proc/{pid}/stat").read_text().split()[2] != "Z"
    except OSError:
        return False


def stop_recorded(state_dir: Path, timeout: float = 15.0) -> list[int]:
    """``down``: ask the supervising ``up`` to stop, then kill every recorded process group.

    Returns the pids that were still alive at the start (for the caller to report).
    """
    path = Path(state_dir) / "stack.json"
    if not path.exists():
        return []
    info = json.loads(path.read_text())
    pids = [c["pid"] for c in (info.get(k) for k in ("temporal", "iris", "registry_open", "registry_token",
                                                        "github")) if c and c.get("pid")]
    sup = info.get("supervisor_pid")
    alive = [p for p in [sup, *pids] if p and p != os.getpid() and _alive(p)]
    if sup and sup != os.getpid() and _alive(sup):
        os.kill(sup, signal.SIGTERM)
        deadline = time.monotonic() + timeout
        while _alive(sup) and time.monotonic() < deadline:
            time.sleep(0.1)
    for pid in pids:  # backstop: the services' own process groups
        for sig in (signal.SIGTERM, signal.SIGKILL):
            try:
                os.killpg(pid, sig)
            except (ProcessLookupError, PermissionError):
                break
            time.sleep(0.2)
    iris = info.get("iris") or {}
    if iris.get("marker"):  # Iris tasks run in their own sessions; sweep them by their marker
        try:
            from sandbox.iris_controller import _kill_all, _processes_with_marker

            _kill_all(_processes_with_marker(iris["marker"]))
        except ImportError:
            pass
    if sup and sup != os.getpid() and _alive(sup):
        os.kill(sup, signal.SIGKILL)
    return alive


def recorded_status(state_dir: Path) -> dict[str, Any]:
    """``status``: the recorded endpoints with whether each process is alive."""
    path = Path(state_dir) / "stack.json"
    if not path.exists():
        return {"running": False, "reason": f"no {path}"}
    info = json.loads(path.read_text())
    status: dict[str, Any] = {"running": bool(info.get("supervisor_pid") and _alive(info["supervisor_pid"]))}
    for key in ("temporal", "iris", "registry_open", "registry_token", "github"):
        comp = info.get(key)
        if comp:
            status[key] = {**comp, "alive": bool(comp.get("pid") and _alive(comp["pid"]))}
    return status
