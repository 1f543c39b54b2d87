"""A SIGTERM to the test session (CI's timeout) ends it at once and stops what its fixtures started, even
while an async test is running: one real pytest subprocess with this suite's conftest."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

SESSION = '''
import asyncio, subprocess, pytest

@pytest.fixture(scope="session")
def service():
    proc = subprocess.Popen(["sleep", "600"])
    open({pidfile!r}, "w").write(str(proc.pid))
    yield proc
    proc.terminate()
    proc.wait()

@pytest.mark.asyncio
async def test_runs_long(service):
    open({ready!r}, "w").close()
    await asyncio.sleep(600)

def test_never_reached():
    open({reached!r}, "w").close()
'''


# scripts/test runs two xdist workers: the SIGTERM reaches only the controller (the process CI started),
# which must end its workers so that their fixtures stop their services too.
@pytest.mark.parametrize("workers", [[], ["-n", "1"]], ids=["one-process", "xdist"])
def test_sigterm_during_an_async_test_ends_the_session_and_stops_its_services(tmp_path, workers):
    pidfile, ready, reached = tmp_path / "pid", tmp_path / "ready", tmp_path / "reached"
    test_file = tmp_path / "test_session.py"
    test_file.write_text(SESSION.format(pidfile=str(pidfile), ready=str(ready), reached=str(reached)))
    env = {**os.environ, "PYTHONFAULTHANDLER": "1"}  # a hung session is sent SIGABRT: its stacks reach the output
    # Its own --basetemp: with pytest's default one the session, as it ends, deletes older sessions' numbered
    # temp dirs under /tmp/pytest-of-<user> (a previous run of this suite leaves ~900 MB), which took over 60 s
    # under load and timed this test out in 10 of 14 loaded suite runs.
    proc = subprocess.Popen([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-p", "tests.conftest",
                             "-q", "-o", "asyncio_mode=strict", "--rootdir", str(tmp_path),
                             "--basetemp", str(tmp_path / "basetemp"), *workers, str(test_file)],
                            cwd=ROOT, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    try:
        deadline = time.monotonic() + 60
        while not ready.exists():
            assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()[0]
            time.sleep(0.1)
        service_pid = int(pidfile.read_text())
        proc.send_signal(signal.SIGTERM)
        try:
            out, _ = proc.communicate(timeout=60)
        except subprocess.TimeoutExpired:
            pytest.fail(_hung(proc))
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode != 0, out  # CI must not read an interrupted session as green
    assert not reached.exists(), out  # the session ended; it did not go on with the next test
    try:
        os.kill(service_pid, 0)
        alive = True
    except ProcessLookupError:
        alive = False
    assert not alive, "the session fixture's process outlived the interrupted session"


def _tree(pid: int) -> list[int]:
    """``pid`` and its descendants, from /proc."""
    from tests.conftest import _children

    found, todo = [], [pid]
    while todo:
        p = todo.pop()
        found.append(p)
        todo.extend(_children(p))
    return found


def _hung(proc: subprocess.Popen) -> str:
    """What a session that did not end after SIGTERM was doing: each process's state and signal masks, then
    every thread's stack (faulthandler, on SIGABRT)."""
    report = []
    for pid in _tree(proc.pid):
        try:
            status = Path(f"/proc/{pid}/status").read_text().splitlines()
            cmd = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")[:160]
        except OSError:
            continue
        report.append(f"{pid} {cmd}: " + "; ".join(line for line in status if line.startswith(
            ("State", "SigPnd", "ShdPnd", "SigBlk", "SigIgn", "SigCgt"))))
    for pid in reversed(_tree(proc.pid)):
        try:
            os.kill(pid, signal.SIGABRT)
        except ProcessLookupError:
            pass
    try:
        out, _ = proc.communicate(timeout=15)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, _ = proc.communicate()
    return "the session did not end within 60 s of SIGTERM\n" + "\n".join(report) + "\n" + out[-6000:]
