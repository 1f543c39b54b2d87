"""The README's "Your first build on the sandbox (five commands)", run as written (issue 38.4).

The first line runs in the background as the README's first terminal; the test waits for its
``stack is up`` line (what the README tells the newcomer to wait for), checks the lines it printed (the
``export`` line, the ``--cluster`` flags, the operator login) and runs the other four lines, unchanged, in
one bash session as the second terminal. Two differences, both outside the five lines: the first line runs
``python -m sandbox.demo`` (what ``scripts/sandbox-build`` execs after ``scripts/bootstrap``, which installs
what is missing and is not run from a test), and ``/tmp/grb-sandbox`` is this test's own directory. Nothing
sets a check run: CI reports green by itself (the GitHub stand-in's auto-green), or the merge never comes.
The test ends as a newcomer does, by stopping the kept stack: SIGTERM to the first line's process stops every
process it started (test_demo_signals.py's ``--keep`` case, run here on the stack this test already paid for).
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from tests.sandbox.test_demo_signals import _Demo, _mentioning, stop_with_sigterm

ROOT = Path(__file__).resolve().parents[2]
README_STATE = "/tmp/grb-sandbox"

pytestmark = [pytest.mark.stack, pytest.mark.timeout(1500)]


def readme_block() -> list[str]:
    text = (ROOT / "README.md").read_text()
    m = re.search(r"<!-- first-build: run by tests/sandbox/test_first_build.py -->\n```sh\n(.*?)```", text, re.S)
    assert m, "README.md has no first-build block"
    return [line for line in m.group(1).splitlines() if line.strip()]


def test_the_readme_first_build_is_five_commands():
    lines = readme_block()
    assert len(lines) == 5 and lines[0] == f"scripts/sandbox-build --keep --state-dir {README_STATE}", lines


def test_the_five_command_first_build_runs_as_written(tmp_path):
    lines = readme_block()
    state = tmp_path / "grb-sandbox"
    first = lines[0].split()
    assert first[0] == "scripts/sandbox-build"
    demo = _Demo(state, *[a for a in first[1:] if a not in ("--state-dir", README_STATE)])
    try:
        demo.wait_for(lambda line: line.startswith("stack is up"), timeout=900)
        printed = demo.output
        export = (f"export GPU_RL_BUILDER_CONFIG={state / 'config.toml'} GPU_RL_BUILDER_OPERATOR=sandbox-operator"
                  ' PATH="$PWD/.venv/bin:$PATH"')
        assert f"  {export}" in printed, printed
        assert lines[1] == export.replace(str(state), README_STATE)  # the README's line is what it prints
        assert "  cluster flags for build: --cluster amd64=sandbox-amd64 --cluster arm64=sandbox-arm64" in printed, printed
        assert "  operator login for --by: sandbox-operator" in printed, printed
        assert "--cluster arm64=sandbox-arm64" in lines[2] and '--by "$GPU_RL_BUILDER_OPERATOR"' in lines[4]

        script = "set -euo pipefail\n" + "\n".join(line.replace(README_STATE, str(state)) for line in lines[1:]) + "\n"
        env = {k: v for k, v in os.environ.items() if not k.startswith(("TEMPORAL_", "GPU_RL_BUILDER_"))}
        # PATH as a fresh shell has it, without the venv: the export line must make `python` the project's.
        venv_bin = str(Path(sys.executable).parent)
        env.update(PATH=os.pathsep.join(p for p in env.get("PATH", "").split(os.pathsep) if p != venv_bin),
                   PYTHONUNBUFFERED="1")
        ran = subprocess.run(["bash", "-c", script], cwd=ROOT, env=env, capture_output=True, text=True,
                             timeout=1200)
        out = ran.stdout + ran.stderr
        assert ran.returncode == 0, out
        wid = re.search(r"gpu-rl-build-[0-9a-f]{12}-[0-9a-f]{12}", out)
        assert wid, out
        # follow --until-operator stopped at the merge authorization, showing its command ...
        assert f"stopped following: {wid.group(0)} waits for an operator" in out, out
        # the printed command is the one the last line runs, --by filled from $GPU_RL_BUILDER_OPERATOR
        assert f"python starter.py approve-merge {wid.group(0)} --by sandbox-operator" in out, out
        # ... and the last line authorized it and followed the build to its merge, ending in a few lines.
        assert "merge authorized by sandbox-operator" in out, out
        assert re.search(rf"^merged: {wid.group(0)} — merge commit [0-9a-f]{{12}}$", out, re.M), out
        assert f"full report: python starter.py report {wid.group(0)}" in out, out

        # The kept stack stops on SIGTERM exactly as on Ctrl-C (tests/sandbox/test_demo_signals.py's --keep case).
        code, leftovers = stop_with_sigterm(demo, state)
    finally:
        if demo.proc.poll() is None:
            os.killpg(demo.proc.pid, signal.SIGTERM)
            try:
                demo.proc.wait(timeout=120)
            except subprocess.TimeoutExpired:
                demo.kill()
    assert leftovers == [], leftovers
    assert code in (0, 1), demo.output  # the demo build's own result; the signal only ended the wait
    assert "sandbox stopped; no process left running" in demo.output, demo.output
    assert f"sandbox state left in {state}" in demo.output and "--clean" in demo.output, demo.output
    assert _mentioning(str(state)) == []
