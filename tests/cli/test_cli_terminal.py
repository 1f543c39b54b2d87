"""On a real 80-column terminal (tmux), ``status`` and ``follow`` print no line wider than the terminal,
every workflow id whole on one row, and the command that unblocks a wait whole (split between
arguments with shell continuations when it is longer than a row).

tmux draws the CLI exactly as an operator's terminal would: ``capture-pane -J`` joins rows the
terminal wrapped, so a line longer than 80 columns shows up as one. The build is a stand-in
pipeline with two stand-in targets (one waiting for an operator decision, one running), so no Iris
job runs; Temporal, the CLI and the terminal are real. tmux runs on its own socket, stopped at the end."""

from __future__ import annotations

import asyncio
import json
import shlex
import shutil
import subprocess
import uuid
from pathlib import Path

import pytest
from temporalio import workflow
from temporalio.worker import UnsandboxedWorkflowRunner, Worker

from domain.models import target_workflow_id
from domain.outcome import decide_command
from tests.cli.starter_cli import _env, argv, minimal_config, starter
from tests.e2e.helpers import wait_until
from tests.workflows.standins import plan, request

pytestmark = [pytest.mark.stack,
              pytest.mark.skipif(shutil.which("tmux") is None, reason="tmux missing: scripts/bootstrap installs it")]

WIDTH = 80


@workflow.defn(name="BuildPipelineWorkflow")
class StandInPipeline:
    """Reports a running build with a plan (real TargetSpecs) and waits until terminated."""

    @workflow.run
    async def run(self, report: dict) -> None:
        self._report = report
        await workflow.wait_condition(lambda: False)

    @workflow.query
    def report(self) -> dict:
        return self._report


@workflow.defn(name="TargetBuildWorkflow")
class StandInTarget:
    @workflow.run
    async def run(self, status: dict) -> None:
        self._status = status
        await workflow.wait_condition(lambda: False)

    @workflow.query
    def status(self) -> dict:
        return self._status



class Tmux:
    """One tmux server on a private socket; each command runs in its own 80×30 session."""

    def __init__(self):
        self.socket = f"grb-test-{uuid.uuid4().hex[:8]}"

    def _run(self, *args: str) -> str:
        return subprocess.run(["tmux", "-L", self.socket, *args], check=True, capture_output=True, text=True,
                              env={**_env(), "TERM": "xterm-256color"}).stdout

    def start(self, name: str, command: list[str]) -> None:
        # The pane stays after the command ends, so a short command's output can still be read.
        self._run("new-session", "-d", "-x", str(WIDTH), "-y", "30", "-s", name, "-c", str(Path.cwd()),
                  shlex.join(command) + "; echo '[exited]'; sleep 600")

    def rows(self, name: str, *, joined: bool = False) -> list[str]:
        """The pane's rows; ``joined``: rows the terminal wrapped joined back into the line printed."""
        return self._run("capture-pane", "-p", *(["-J"] if joined else []), "-t", name).rstrip("\n").split("\n")

    def stop(self) -> None:
        subprocess.run(["tmux", "-L", self.socket, "kill-server"], capture_output=True)


def _one_command(rows: list[str], start: int) -> str:
    """The command printed under ``run:`` at ``start``: rows ending in `` \\`` continue it."""
    parts = []
    for row in rows[start:]:
        parts.append(row.strip().removesuffix("\\").strip())
        if not row.rstrip().endswith("\\"):
            break
    return " ".join(parts)


async def test_status_and_follow_fit_80_columns_with_ids_and_commands_whole(temporal_dev_server, temporal_client,
                                                                            tmp_path):
    client, tmux = temporal_client, Tmux()
    queue = f"terminal-{uuid.uuid4().hex[:6]}"
    wid = f"gpu-rl-build-{uuid.uuid4().hex[:12]}-{uuid.uuid4().hex[:12]}"  # pipeline_id's shape: 38 characters
    long_wid = f"{wid}-plan-schedule-nightly-amd64"  # a schedule's validation plan: 66 characters
    targets = plan(request(archs=("amd64",), variants=("standard", "megatron")))
    waiting_key, running_key = targets[0].key, targets[1].key
    decide = decide_command(wid, waiting_key)
    statuses = {
        waiting_key: {"key": waiting_key, "stage": "waiting", "failure_class": "unknown",
                      "job_ids": [f"/gpu-rl-builder/gpurl-kaniko-{waiting_key}-0a1b2c3d-r2"],
                      "progress": {"job_id": "j1", "state": "killed", "terminal": True, "preemptions": 1,
                                   "last_marker": "[arch] build host=x86_64", "elapsed_s": 754},
                      "waiting": {"kind": "operator_decision", "target": waiting_key, "command": decide,
                                  "detail": "operator decision on the unknown failure of the job; to give up "
                                            f"instead run `{decide_command(wid, waiting_key, 'abort')}`"}},
        running_key: {"key": running_key, "stage": "running", "job_ids": [f"/gpu-rl-builder/gpurl-kaniko-{running_key}"],
                      "progress": {"job_id": "j2", "state": "running", "terminal": False,
                                   "last_marker": "[kaniko] pushing layers", "elapsed_s": 65}},
    }
    report = {"workflow_id": wid, "status": "running", "request": request().model_dump(mode="json"),
              "plan": [t.model_dump(mode="json") for t in targets]}
    cfg = minimal_config(tmp_path, temporal_dev_server.address, queue)
    handles = []
    try:
        async with Worker(client, task_queue=queue, workflows=[StandInPipeline, StandInTarget],
                          workflow_runner=UnsandboxedWorkflowRunner()):
            for pid in (wid, long_wid):
                handles.append(await client.start_workflow("BuildPipelineWorkflow", {**report, "workflow_id": pid},
                                                           id=pid, task_queue=queue))
            for key, st in statuses.items():
                handles.append(await client.start_workflow("TargetBuildWorkflow", st, id=target_workflow_id(wid, key),
                                                           task_queue=queue))
            query = f"WorkflowId = '{wid}' OR WorkflowId = '{long_wid}'"

            async def listed():
                ran = await starter(cfg, "status", "--query", query, "--json")
                return ran.code == 0 and len(json.loads(ran.out)) == 2
            await wait_until(listed, what="status lists both pipelines", timeout=60)

            tmux.start("status", argv(cfg, "status", "--query", query))
            tmux.start("follow", argv(cfg, "follow", wid, "--interval", "1"))

            async def drawn(name: str, needle: str):
                await asyncio.sleep(0)
                rows = tmux.rows(name)
                return rows if any(needle in r for r in rows) else None
            status_rows = await wait_until(lambda: drawn("status", "[exited]"), what="status printed", timeout=120)
            follow_rows = await wait_until(lambda: drawn("follow", "  run:"), what="follow drew the wait",
                                           timeout=120)
            status_joined, follow_joined = tmux.rows("status", joined=True), tmux.rows("follow", joined=True)
    finally:
        tmux.stop()
        for h in handles:
            await h.terminate()

    text = "\n".join(status_joined)
    assert all(len(line) <= WIDTH for line in status_joined), text
    for pid in (wid, long_wid):  # each id whole within one row, never cut or wrapped
        assert any(pid in row for row in status_rows), text
    assert "…" not in text, text

    text = "\n".join(follow_joined)
    assert all(len(line) <= WIDTH for line in follow_joined), text
    assert any(row.startswith(wid) for row in follow_rows), text  # the build id heads the view, whole
    for word in (waiting_key, running_key, "[unknown]", "12m34s", "1m05s", "(killed)", "preempted×1",
                 "[arch] build host=x86_64", "[kaniko] pushing layers"):
        assert word in text, (word, text)
    run = follow_rows.index("  run:")
    assert _one_command(follow_rows, run + 1) == decide, text  # the exact command, split between arguments
    assert any(wid in row for row in follow_rows[run + 1:]), text


