"""Issue 38.5 on a real 80×30 terminal (tmux): ``follow`` of a normal 4-target build, waiting, running and
done. Every unblock command is on the screen whole, the four identical waits are one block, the elapsed
times tick between changes, and the build ends with a few lines and a pointer to ``report``.

The pipeline and its targets are stand-in workflows (no Iris job runs) whose report and statuses the test
sets by signal; Temporal, the CLI and the terminal are real. Each phase's screen is printed (run with -s, or
read the failure output) and written to ``<basetemp>/terminal-80x30-<phase>.txt``; docs/terminal.md holds one
run's captures."""

from __future__ import annotations

import asyncio
import re
import shutil
import uuid
from pathlib import Path

import pytest
from temporalio import workflow
from temporalio.worker import UnsandboxedWorkflowRunner, Worker

from domain.models import (
    JobProgress,
    PipelineReport,
    PullRequestInfo,
    Stage,
    TargetResult,
    TargetStatus,
    target_workflow_id,
)
from domain.outcome import recheck_command
from tests.cli.starter_cli import argv, minimal_config
from tests.cli.test_cli_terminal import WIDTH, Tmux
from tests.e2e.helpers import wait_until
from tests.workflows.standins import plan, request

pytestmark = [pytest.mark.stack,
              pytest.mark.skipif(shutil.which("tmux") is None, reason="tmux missing: scripts/bootstrap installs it")]
HEIGHT = 30


@workflow.defn(name="BuildPipelineWorkflow")
class Pipeline:
    @workflow.init
    def __init__(self, report: dict) -> None:
        self._report, self._final = report, None

    @workflow.run
    async def run(self, report: dict) -> dict:
        await workflow.wait_condition(lambda: self._final is not None)
        return self._final

    @workflow.query
    def report(self) -> dict:
        return self._report

    @workflow.signal
    def finish(self, final: dict) -> None:
        self._final = final


@workflow.defn(name="TargetBuildWorkflow")
class Target:
    @workflow.init
    def __init__(self, status: dict) -> None:
        self._status = status

    @workflow.run
    async def run(self, status: dict) -> None:
        await workflow.wait_condition(lambda: self._status.get("stage") == "done")

    @workflow.query
    def status(self) -> dict:
        return self._status

    @workflow.signal
    def set_status(self, status: dict) -> None:
        self._status = status


def _waiting(wid: str, key: str) -> dict:
    return TargetStatus(
        key=key, stage=Stage.WAITING, failure_class="visibility", job_ids=[f"/gpu-rl-builder/gpurl-kaniko-{key}-0a1b2c3d"],
        progress=JobProgress(job_id="j", state="succeeded", terminal=True, elapsed_s=754,
                             last_marker="Pushed ghcr.io/marin-community/marinskyrl@sha256:0f1e"),
        waiting={"kind": "package_visibility", "target": key, "command": recheck_command(wid, key),
                 "detail": "ghcr.io/marin-community/marinskyrl is not anonymously pullable: make the package public "
                           "(GitHub → Packages → Package settings → Change visibility → Public), then re-check"},
    ).model_dump(mode="json")


def _running(key: str, elapsed: float) -> dict:
    return TargetStatus(
        key=key, stage=Stage.RUNNING, job_ids=[f"/gpu-rl-builder/gpurl-kaniko-{key}-0a1b2c3d"],
        progress=JobProgress(job_id="j", state="running", terminal=False, elapsed_s=elapsed,
                             last_marker="[kaniko] pushing layers"),
    ).model_dump(mode="json")


def _screen(tmux: Tmux, name: str, phase: str, out: Path) -> list[str]:
    rows = tmux.rows(name)
    text = "\n".join(rows)
    (out / f"terminal-80x30-{phase}.txt").write_text(text + "\n")
    print(f"\n----- follow at {WIDTH}×{HEIGHT}, {phase} -----\n{text}\n-----")
    return rows


def _commands(rows: list[str]) -> list[str]:
    """Every command printed under ``run:`` (continuation lines joined), as printed."""
    out = []
    for i, row in enumerate(rows):
        if row.strip() == "run:":
            parts = []
            for line in rows[i + 1:]:
                parts.append(line.strip().removesuffix("\\").strip())
                if not line.rstrip().endswith("\\"):
                    break
            out.append(" ".join(parts))
        elif row.startswith("  run: "):
            out.append(row.removeprefix("  run: ").strip())
    return out


async def test_follow_a_four_target_build_at_80x30_waiting_running_done(temporal_dev_server, temporal_client,
                                                                      tmp_path):
    client, tmux = temporal_client, Tmux()
    queue = f"terminal4-{uuid.uuid4().hex[:6]}"
    wid = f"gpu-rl-build-{uuid.uuid4().hex[:12]}-{uuid.uuid4().hex[:12]}"
    targets = plan(request(archs=("amd64", "arm64"), variants=("standard", "megatron")))
    keys = [t.key for t in targets]
    report = PipelineReport(workflow_id=wid, status="running", request=request(archs=("amd64", "arm64")),
                            plan=targets).model_dump(mode="json")
    cfg = minimal_config(tmp_path, temporal_dev_server.address, queue)
    out = tmp_path
    handles = {}
    screens: dict[str, list[str]] = {}
    try:
        async with Worker(client, task_queue=queue, workflows=[Pipeline, Target],
                          workflow_runner=UnsandboxedWorkflowRunner()):
            pipeline = await client.start_workflow("BuildPipelineWorkflow", report, id=wid, task_queue=queue)
            for key in keys:
                handles[key] = await client.start_workflow("TargetBuildWorkflow", _waiting(wid, key),
                                                           id=target_workflow_id(wid, key), task_queue=queue)
            tmux.start("follow", argv(cfg, "follow", wid, "--interval", "1"))

            async def drawn(needle: str, *, after: int = 0):
                await asyncio.sleep(0)
                rows = tmux.rows("follow")
                return rows if any(needle in r for r in rows[after:]) else None

            # 1. Waiting: four identical waits, one block, its command whole on the screen.
            await wait_until(lambda: drawn("    done"), what="follow drew the grouped wait", timeout=120)
            screens["waiting"] = _screen(tmux, "follow", "waiting", out)

            # 2. Running: elapsed times tick between changes (the statuses do not change).
            for key in keys:
                await handles[key].signal("set_status", _running(key, 65))
            await wait_until(lambda: drawn("[kaniko] pushing layers"), what="follow drew the running targets",
                             timeout=120)
            first = _screen(tmux, "follow", "running", out)
            await asyncio.sleep(7)  # the live view ticks at least every 5 s
            screens["running"] = _screen(tmux, "follow", "running", out)
            screens["running-before"] = first

            # 3. Done: the build ends; follow prints a few lines and where the full report is.
            done = [TargetResult(key=t.key, architecture=t.architecture, variant=t.variant, status="validated",
                                 cluster="sandbox", job_ids=[f"/gpu-rl-builder/gpurl-kaniko-{t.key}-0a1b2c3d"],
                                 tag=f"gpu-rl-{t.key}", image_ref=f"ghcr.io/m/r:gpu-rl-{t.key}",
                                 digest="sha256:" + f"{i}" * 64) for i, t in enumerate(targets)]
            final = PipelineReport(
                workflow_id=wid, status="merged", request=request(archs=("amd64", "arm64")), plan=targets,
                targets=done, merge_commit="4d5e6f" + "0" * 34,
                pull_request=PullRequestInfo(number=42, url="https://github.com/marin-community/MarinSkyRL/pull/42",
                                             head_sha="a" * 40, merged=True)).model_dump(mode="json")
            for key in keys:
                ended = _running(key, 601)
                ended["progress"].update(state="succeeded", terminal=True, last_marker="validated: digest, platform, "
                                                                                    "labels, anonymous pull")
                await handles[key].signal("set_status", {**ended, "stage": "done"})
            await pipeline.signal("finish", final)
            await wait_until(lambda: drawn("[exited]"), what="follow ended", timeout=120)
            screens["done"] = _screen(tmux, "follow", "done", out)
            joined = tmux.rows("follow", joined=True)
    finally:
        tmux.stop()
        for h in [*handles.values()]:
            try:
                await h.terminate()
            except Exception:  # noqa: BLE001 - already ended
                pass
        try:
            await client.get_workflow_handle(wid).terminate()
        except Exception:  # noqa: BLE001 - already ended
            pass

    waiting = screens["waiting"]
    text = "\n".join(waiting)
    assert len(waiting) <= HEIGHT and all(len(r) <= WIDTH for r in waiting), text
    assert sum(r.startswith("WAITING") for r in waiting) == 1, text  # four identical waits: one block
    [command] = _commands(waiting)
    assert command == (f"for t in {' '.join(keys)}; do python starter.py recheck {wid} \"$t\"; done"), text
    assert all(k in text for k in keys) and "then" in text and "re-check" in text, text  # the reason whole

    before, after = "\n".join(screens["running-before"]), "\n".join(screens["running"])
    ticks = re.findall(r"\b(\d+)m(\d\d)s\b", before), re.findall(r"\b(\d+)m(\d\d)s\b", after)
    assert ticks[0] and ticks[1] and ticks[0] != ticks[1], (before, after)  # the elapsed times moved on
    assert int(ticks[1][0][0]) * 60 + int(ticks[1][0][1]) >= 65 + 5, after

    done_text = "\n".join(joined)
    assert all(len(line) <= WIDTH for line in joined), done_text
    tail = done_text[done_text.index(f"merged: {wid}"):done_text.index("[exited]")].strip().splitlines()
    assert 4 <= len(tail) <= 6, tail  # outcome, PR, digests, next step, and the pointer to report
    assert tail[0] == f"merged: {wid} — merge commit 4d5e6f000000", tail
    assert tail[1] == "PR #42 https://github.com/marin-community/MarinSkyRL/pull/42", tail
    assert all(k in "\n".join(tail) for k in keys) and "sha256:000000000000" in "\n".join(tail), tail
    assert tail[-1] == f"full report: python starter.py report {wid}", tail
    assert "# GPU-RL build" not in done_text  # not the whole report
