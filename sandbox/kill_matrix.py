"""Kill matrix: SIGKILL the worker while each step of one build runs, start a new worker with an empty
work directory, and measure how long the step takes to run again.

Shared by the e2e test (tests/e2e/test_kill_matrix_e2e.py: the build finishes with one of each side
effect, every step runs again within a bound) and the benchmark (bench/resume_after_kill.py: the
table of resume times). Each worker is a real ``worker.py`` process in its own process group; each
gets a fresh ``work_dir`` (its config differs only there), as a replacement pod with an ``emptyDir``.

To catch a step while it runs, the sandbox makes it slow: git is ``sandbox/slow_git/git`` (the real
git behind chosen subcommands' delay) and the GitHub stand-in answers the merge late. The delay is
lifted right after the kill, so what is measured is the service's own recovery: the heartbeat timeout
noticing the dead worker, the retry backoff, and the new worker picking the step up.
"""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import functools
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from temporalio.api.enums.v1 import PendingActivityState
from temporalio.client import Client, WorkflowHandle, WorkflowUpdateFailedError

from domain.models import MergeAuthorization, PipelineReport, target_workflow_id
from workflows.pipeline import BuildPipelineWorkflow

ROOT = Path(__file__).resolve().parents[1]
SLOW_GIT_DIR = Path(__file__).resolve().parent / "slow_git"
STEP_DELAY_S = 8.0  # long enough to be seen running and killed, short against every timeout


_LIVE: set[subprocess.Popen] = set()


@atexit.register
def _stop_leftovers() -> None:
    for proc in _LIVE:
        if proc.poll() is None:
            with contextlib.suppress(OSError):
                os.killpg(proc.pid, signal.SIGKILL)


@dataclass(frozen=True)
class Phase:
    name: str
    activity: str
    in_target: bool = False  # runs in the target's child workflow
    slow_git: tuple[str, ...] = ()  # git subcommands made slow while waiting for the step to start
    slow_merge: bool = False


PHASES = (
    Phase("load", "load_build_state", slow_git=("fetch",)),
    Phase("publish", "publish_source", slow_git=("push",)),
    Phase("submit", "submit_job", in_target=True, slow_git=("clone",)),
    # Validation reads no git (the target carries its layer ceiling): its registry credential is made slow.
    Phase("validate", "validate_image", in_target=True, slow_git=("registry-token",)),
    Phase("record", "record_artifact", slow_git=("push",)),
    Phase("merge", "merge_pull_request", slow_merge=True),
)


@dataclass
class PhaseResult:
    phase: str
    activity: str
    killed_attempt: int
    resume_s: float  # new worker started → the step running again (or already done)
    since_kill_s: float  # SIGKILL → the step running again


@dataclass
class KillMatrix:
    client: Client
    config_path: Path
    state_dir: Path
    github: object  # GitHubStandinHandle: set_check, slow_down
    repo_slug: str
    target_key: str = "amd64-standard"
    phases: tuple[Phase, ...] = PHASES
    resume_bound_s: float = 60.0
    results: list[PhaseResult] = field(default_factory=list)
    _workers: list[subprocess.Popen] = field(default_factory=list)

    # ------------------------------------------------------------------ workers
    @property
    def slow_file(self) -> Path:
        return self.state_dir / "slow-git.txt"

    def _slow(self, phase: Phase | None) -> None:
        lines = [f"{cmd} {STEP_DELAY_S}" for cmd in (phase.slow_git if phase else ())]
        self.slow_file.write_text("\n".join(lines) + ("\n" if lines else ""))
        self.github.slow_down("PUT", r"/pulls/\d+/merge$", STEP_DELAY_S if phase and phase.slow_merge else 0)

    def _slow_git_dir(self) -> Path:
        """A PATH entry whose ``git`` is the slow stand-in with the real git and the delay file baked in.

        Baked into the wrapper, not passed as environment variables: the service gives git an
        allow-listed environment (clients/child_env.py), which rightly drops variables it does not know."""
        bin_dir = self.state_dir / "slow-git-bin"
        bin_dir.mkdir(parents=True, exist_ok=True)
        wrapper = bin_dir / "git"
        wrapper.write_text("#!/usr/bin/env bash\n"
                           f"export REAL_GIT={shlex.quote(shutil.which('git') or 'git')}\n"
                           f"export SLOW_GIT_FILE={shlex.quote(str(self.slow_file))}\n"
                           f"exec bash {shlex.quote(str(SLOW_GIT_DIR / 'git'))} \"$@\"\n")
        wrapper.chmod(0o755)
        return bin_dir

    def _slow_registry_token(self, text: str) -> str:
        """The [registry] token read by a command that waits as the delay file says ("registry-token N"), as a
        slow credential command (`gh auth token`, a vault CLI) would; the value is the same file's."""
        head, sep, rest = text.partition("\n[registry]\n")
        if not sep:
            return text
        def command(m: re.Match) -> str:
            argv = ["bash", str(SLOW_GIT_DIR / "secret"), str(self.slow_file), "registry-token", m["path"]]
            return "token = {kind = \"command\", argv = [" + ", ".join(f'"{a}"' for a in argv) + "]}"
        section, nxt, tail = rest.partition("\n[")
        section = re.sub(r'(?m)^token = \{"?kind"? = "file", "?path"? = "(?P<path>[^"]+)"\}$', command, section,
                         count=1)
        return head + sep + section + nxt + tail

    def start_worker(self) -> subprocess.Popen:
        """A new worker process with an empty work directory of its own."""
        proc = self._start_worker()
        _LIVE.add(proc)  # stopped at exit too: a driver cut short (a test's timeout) leaves no worker behind
        return proc

    def _start_worker(self) -> subprocess.Popen:
        n = len(self._workers) + 1
        work = self.state_dir / f"work-{n}"
        text = self.config_path.read_text()
        config = self.state_dir / f"config-worker-{n}.toml"
        text = re.sub(r'(?m)^work_dir = ".*"$', f'work_dir = "{work}"', text, count=1)
        config.write_text(self._slow_registry_token(text))
        env = {**os.environ, "PATH": f"{self._slow_git_dir()}{os.pathsep}{os.environ.get('PATH', '')}"}
        log = open(self.state_dir / f"worker-{n}.log", "w")  # noqa: SIM115 - the process owns it
        proc = subprocess.Popen([sys.executable, str(ROOT / "worker.py"), "--config", str(config),
                                 "--graceful-shutdown", "5"], cwd=ROOT, env=env, stdout=log,
                                stderr=subprocess.STDOUT, start_new_session=True)
        self._workers.append(proc)
        return proc

    def stop_all(self) -> None:
        for p in self._workers:
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGTERM)
                try:
                    p.wait(timeout=30)
                except subprocess.TimeoutExpired:
                    os.killpg(p.pid, signal.SIGKILL)
                    p.wait()

    @staticmethod
    def kill(proc: subprocess.Popen) -> None:
        os.killpg(proc.pid, signal.SIGKILL)  # the worker and its git children: no graceful anything
        proc.wait(timeout=30)

    # ------------------------------------------------------------------ the run
    async def run(self, handle: WorkflowHandle) -> PipelineReport:
        """Drive one build through every phase (killing the worker in each), then return its report."""
        self._slow(self.phases[0] if self.phases else None)
        worker = self.start_worker()
        try:
            for phase in self.phases:
                self._slow(phase)
                wid = target_workflow_id(handle.id, self.target_key) if phase.in_target else handle.id
                if phase.slow_merge:
                    await self._authorize_merge(handle)
                attempt = await _wait(functools.partial(self._started, wid, phase.activity), 600,
                                      f"{phase.name} running")
                self.kill(worker)
                killed = time.monotonic()
                self._slow(None)
                worker = self.start_worker()
                started = time.monotonic()
                await _wait(functools.partial(self._resumed, wid, phase.activity, attempt), self.resume_bound_s,
                            f"{phase.name} ({phase.activity}) running again")
                now = time.monotonic()
                self.results.append(PhaseResult(phase.name, phase.activity, attempt, now - started, now - killed))
            if not any(p.slow_merge for p in self.phases):  # a subset of the phases: the build still merges
                await self._authorize_merge(handle)
            return await asyncio.wait_for(handle.result(), 600)
        finally:
            self._slow(None)
            self.stop_all()

    async def _pending(self, wid: str, activity: str):
        try:
            desc = await self.client.get_workflow_handle(wid).describe()
        except Exception:  # noqa: BLE001 - the child may not exist yet
            return None, False
        for pa in desc.raw_description.pending_activities:
            if pa.activity_type.name == activity:
                return pa, True
        return None, True

    async def _started(self, wid: str, activity: str) -> int | None:
        pa, _ = await self._pending(wid, activity)
        if pa is not None and pa.state == PendingActivityState.PENDING_ACTIVITY_STATE_STARTED:
            return pa.attempt
        return None

    async def _resumed(self, wid: str, activity: str, killed_attempt: int) -> bool:
        pa, exists = await self._pending(wid, activity)
        if pa is None:
            return exists  # no longer pending: it completed
        return pa.attempt > killed_attempt and pa.state == PendingActivityState.PENDING_ACTIVITY_STATE_STARTED

    async def _authorize_merge(self, handle: WorkflowHandle) -> None:
        """Play the operator: CI green on the PR head, then approve-merge until the workflow accepts it."""
        async def accepted() -> bool:
            rep = await handle.query(BuildPipelineWorkflow.report)
            if not rep.pull_request:
                return False
            self.github.set_check(self.repo_slug, rep.pull_request.head_sha, "ci")
            try:
                await handle.execute_update(BuildPipelineWorkflow.approve_merge, MergeAuthorization(by="kill-matrix"))
            except WorkflowUpdateFailedError:
                return False
            return True
        await _wait(accepted, 600, "merge authorized", interval=1.0)


async def _wait(predicate, within_s: float, what: str, interval: float = 0.1):
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        value = await predicate()
        if value:
            return value
        await asyncio.sleep(interval)
    raise AssertionError(f"gave up waiting for {what} after {within_s:.0f}s")


def table(results: list[PhaseResult]) -> str:
    """Markdown table of resume times per phase."""
    rows = ["| phase | activity | killed in attempt | new worker start → running again | SIGKILL → running again |",
            "|---|---|---|---|---|"]
    rows += [f"| {r.phase} | `{r.activity}` | {r.killed_attempt} | {r.resume_s:.1f} s | {r.since_kill_s:.1f} s |"
             for r in results]
    return "\n".join(rows)
