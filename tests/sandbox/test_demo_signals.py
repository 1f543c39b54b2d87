"""``scripts/sandbox-build`` (``python -m sandbox.demo``) stops everything on SIGTERM exactly as on Ctrl-C:
mid-build (here), and with ``--keep`` once the stack is left up (tests/sandbox/test_first_build.py: the
README's first line is ``scripts/sandbox-build --keep``; that test ends by ``stop_with_sigterm`` on it, so the
demo build both tests started with runs once). A real demo process on its own state directory;
"everything" is every process whose command line names that directory (worker, Temporal, Iris controller,
registries, GitHub stand-in) plus the pids recorded in its ``stack.json``."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from sandbox.stack import _alive

ROOT = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.stack  # starts a whole sandbox of its own


def _mentioning(needle: str) -> list[tuple[int, str]]:
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            cmd = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if needle in cmd and _alive(int(entry.name)):
            found.append((int(entry.name), cmd.strip()))
    return found


class _Demo:
    def __init__(self, state_dir: Path, *args: str):
        env = {k: v for k, v in os.environ.items() if not k.startswith(("TEMPORAL_", "GPU_RL_BUILDER_"))}
        env["PYTHONUNBUFFERED"] = "1"
        self.proc = subprocess.Popen([sys.executable, "-m", "sandbox.demo", "--state-dir", str(state_dir), *args],
                                     cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                     start_new_session=True)
        self.lines: list[str] = []
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        for line in self.proc.stdout:
            self.lines.append(line.rstrip("\n"))

    def wait_for(self, predicate, timeout: float) -> str:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            hit = next((line for line in self.lines if predicate(line)), None)
            if hit is not None:
                return hit
            if self.proc.poll() is not None and not self._reader.is_alive():
                raise AssertionError(f"demo ended (exit {self.proc.returncode}) before the line:\n{self.output}")
            time.sleep(0.2)
        raise AssertionError(f"no such line within {timeout:.0f}s:\n{self.output}")

    @property
    def output(self) -> str:
        return "\n".join(self.lines)

    def kill(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)


def stop_with_sigterm(demo: _Demo, state: Path) -> tuple[int, list[tuple[int, str]]]:
    """SIGTERM to the demo process only (as `kill PID` does) while its stack and worker run; its exit code and
    what is left: every process naming ``state`` and every pid its ``stack.json`` recorded still alive."""
    recorded = json.loads((state / "stack.json").read_text())
    pids = [c["pid"] for c in (recorded.get(k) for k in ("temporal", "iris", "registry_open", "registry_token",
                                                        "github")) if c and c.get("pid")]
    assert len(pids) >= 4, recorded
    running = _mentioning(str(state))
    assert any("worker.py" in cmd for _pid, cmd in running), running  # the worker is one of them
    demo.proc.send_signal(signal.SIGTERM)
    code = demo.proc.wait(timeout=120)
    demo._reader.join(timeout=10)
    return code, _mentioning(str(state)) + [(p, "recorded in stack.json") for p in pids if _alive(p)]


def test_sigterm_mid_build_stops_the_worker_and_every_service(tmp_path):
    state = tmp_path / "demo-state"
    demo = _Demo(state)
    leftovers: list[tuple[int, str]] = []
    try:
        # the build is running: the first progress line of its target
        demo.wait_for(lambda line: line.startswith("[") and "amd64-standard" in line, timeout=300)
        code, leftovers = stop_with_sigterm(demo, state)
    finally:
        demo.kill()
    assert leftovers == [], leftovers
    assert "sandbox stopped; no process left running" in demo.output, demo.output
    assert code == 128 + signal.SIGTERM, demo.output
    assert "interrupted (SIGTERM); stopping everything" in demo.output
