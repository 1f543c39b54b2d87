"""Ctrl-C of ``follow`` stops following within seconds, says that the build goes on, and leaves it running:
also while Temporal does not answer a call, and also when the suite itself runs with SIGINT ignored.

The last case is the cause of the test_cli_operate flake ("follow did not end within 30s" of its Ctrl-C): a
suite started as a background job of a non-interactive shell (``scripts/test > log &``) ignores SIGINT, every
process it spawns inherits that, and a ``follow`` started so never sees a Ctrl-C (its report showed SigIgn
0x...6 and an idle event loop). The harness now starts commands with a terminal's SIGINT
(``starter_cli.TERMINAL_SIGNALS``); a ``follow`` that really runs with SIGINT ignored says how to stop it.

The followed build is test_cli_follow_truth's stand-in pipeline; Temporal and the CLI are real."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import time
import uuid
from pathlib import Path

import pytest
from temporalio import workflow
from temporalio.worker import UnsandboxedWorkflowRunner, Worker

from tests.cli.starter_cli import Follower, _env, argv, minimal_config
from tests.cli.test_cli_follow_truth import REQUEST, _running, _start, _worker

# Ctrl-C to exit, measured in this process under a loaded 2-core machine (the work after the signal is a task
# cancellation and a print; observed 0.1-0.5 s)
EXIT_BOUND_S = 5.0


async def _follow_and_interrupt(follower: Follower, wid: str, *, before_interrupt=None) -> tuple[int, float]:
    try:
        await follower.read_until(lambda x: x.startswith(f"[running] {wid}"), timeout=60)
        if before_interrupt:
            await before_interrupt()
        started = time.monotonic()
        code = await follower.interrupt(timeout=20)
        return code, time.monotonic() - started
    finally:
        follower.stop()


@pytest.mark.parametrize("suite_sigint", ["default", "ignored"])
async def test_ctrl_c_stops_follow_at_once_and_says_the_build_goes_on(temporal_dev_server, temporal_client,
                                                                      tmp_path, suite_sigint):
    queue = f"follow-int-{uuid.uuid4().hex[:6]}"
    async with _worker(temporal_client, queue):
        wid = await _start(temporal_client, queue)
        await _running(temporal_client, wid)
        before = signal.getsignal(signal.SIGINT)
        if suite_sigint == "ignored":  # as in a suite started by `scripts/test > log &` from a script
            signal.signal(signal.SIGINT, signal.SIG_IGN)
        try:
            follower = await Follower.start(minimal_config(tmp_path, temporal_dev_server.address, queue),
                                            "follow", wid, "--interval", "1")
        finally:
            signal.signal(signal.SIGINT, before)
        code, took = await _follow_and_interrupt(follower, wid)
        status = (await temporal_client.get_workflow_handle(wid).describe()).status.name
        await temporal_client.get_workflow_handle(wid).terminate()
    text = follower.output + "\n" + follower.err
    assert code == 130, text  # interrupted: not 0 (done), 1 (failed) or 3 (unreachable)
    assert took < EXIT_BOUND_S, (took, text)
    assert "Ctrl-C stops following, not the build" in follower.lines[0], text
    assert f"stopped following {wid}; the build goes on without this terminal" in follower.output, text
    assert f"`python starter.py follow {wid}` watches it again" in follower.output, text
    assert status == "RUNNING"


async def test_ctrl_c_while_temporal_does_not_answer_a_call_exits_at_once(temporal_dev_server, temporal_client,
                                                                          tmp_path):
    """The dev server is frozen (SIGSTOP) under a running follow: its next call has no answer and no deadline
    (describe), and the Ctrl-C must not wait for one."""
    queue = f"follow-int-{uuid.uuid4().hex[:6]}"
    frozen = False

    async def freeze_then_wait_for_a_call():
        nonlocal frozen
        os.kill(temporal_dev_server.pid, signal.SIGSTOP)
        frozen = True
        await asyncio.sleep(2.5)  # past the follow loop's 1 s sleep: its next call is on the wire, unanswered

    async with _worker(temporal_client, queue):
        wid = await _start(temporal_client, queue)
        await _running(temporal_client, wid)
        follower = await Follower.start(minimal_config(tmp_path, temporal_dev_server.address, queue),
                                        "follow", wid, "--interval", "1")
        try:
            lines_before = None

            async def step():
                nonlocal lines_before
                await freeze_then_wait_for_a_call()
                lines_before = len(follower.lines)

            code, took = await _follow_and_interrupt(follower, wid, before_interrupt=step)
        finally:
            if frozen:
                os.kill(temporal_dev_server.pid, signal.SIGCONT)
        await temporal_client.get_workflow_handle(wid).terminate()
    text = follower.output + "\n" + follower.err
    assert code == 130, text
    assert took < EXIT_BOUND_S, (took, text)
    # nothing was printed while frozen but the interrupt's own lines: the follow was waiting on the call
    assert [line for line in follower.lines[lines_before:] if not line.startswith("stopped following")] == [], text
    assert f"stopped following {wid}; the build goes on" in follower.output, text


async def test_a_follow_that_runs_with_sigint_ignored_says_how_to_stop_it(temporal_dev_server, temporal_client,
                                                                          tmp_path):
    """Started as a background job of a non-interactive shell, a process keeps SIGINT ignored (POSIX; Python
    too): the first line must not promise that Ctrl-C stops it, and the ``kill`` it names does."""
    queue = f"follow-int-{uuid.uuid4().hex[:6]}"
    async with _worker(temporal_client, queue):
        wid = await _start(temporal_client, queue)
        await _running(temporal_client, wid)
        cfg = minimal_config(tmp_path, temporal_dev_server.address, queue)
        proc = await asyncio.create_subprocess_exec(
            "env", "--ignore-signal=INT", *argv(cfg, "follow", wid, "--interval", "1"), env=_env(),
            start_new_session=True, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
        follower = Follower(proc)
        try:
            first = await follower.read_until(lambda x: x.startswith("following "), timeout=60)
            assert "Ctrl-C" not in first and f"`kill {proc.pid}` stops following, not the build" in first, first
            proc.send_signal(signal.SIGINT)  # ignored, as the line says ...
            with pytest.raises(TimeoutError):
                await asyncio.wait_for(asyncio.shield(proc.wait()), 2)
            proc.send_signal(signal.SIGTERM)  # ... and the kill it names stops it
            code = await follower.finish(timeout=EXIT_BOUND_S)
        finally:
            follower.stop()
        status = (await temporal_client.get_workflow_handle(wid).describe()).status.name
        await temporal_client.get_workflow_handle(wid).terminate()
    assert code == -signal.SIGTERM and status == "RUNNING", (code, status, follower.output)


@workflow.defn(name="BuildPipelineWorkflow")
class PlanningPipeline:
    """A pipeline that stays in planning: ``build`` waits for its plan, ``build --follow`` follows it."""

    @workflow.run
    async def run(self, inp: dict) -> None:
        from runtime import search_attributes as sa

        workflow.upsert_search_attributes([sa.STAGE.value_set("planning")])
        await workflow.wait_condition(lambda: False)

    @workflow.query
    def report(self) -> dict:
        return {"workflow_id": workflow.info().workflow_id, "status": "running", "request": REQUEST}


def _repo(path: Path) -> str:
    """A one-commit repository of its own: a pipeline id no other test's build shares."""
    git = ["git", "-C", str(path), "-c", "user.name=t", "-c", "user.email=t@example.invalid"]
    subprocess.run(["git", "init", "-q", str(path)], check=True)
    subprocess.run([*git, "commit", "-q", "--allow-empty", "-m", uuid.uuid4().hex], check=True)
    return path.resolve().as_uri()


async def test_ctrl_c_of_build_and_build_follow_says_the_build_goes_on(temporal_dev_server, temporal_client,
                                                                       tmp_path):
    """``build`` waits for the plan, ``build --follow`` follows (here: a plan that never ends); Ctrl-C of
    either stops this terminal only, at once, and says so."""
    queue = f"build-int-{uuid.uuid4().hex[:6]}"
    cfg = minimal_config(tmp_path, temporal_dev_server.address, queue)
    text = cfg.read_text().replace("file:///nonexistent/m.git", _repo(tmp_path / "m")).replace(
        "file:///nonexistent/h.git", _repo(tmp_path / "h"))
    cfg.write_text(text + '[clusters.c]\ncontroller_url = "http://127.0.0.1:9"\narchitecture = "amd64"\n')
    build = ("build", "--arch", "amd64", "--variant", "standard", "--requested-by", "t", "--reason", "ctrl-c test")
    results = {}
    async with Worker(temporal_client, task_queue=queue, workflows=[PlanningPipeline],
                      workflow_runner=UnsandboxedWorkflowRunner()):
        for args, waiting in ((build, "waits for the plan"), ((*build, "--follow"), "follows")):
            follower = await Follower.start(cfg, *args)
            try:
                first = await follower.read_until(lambda x: x.startswith("workflow: "), timeout=60)
                wid = first.removeprefix("workflow: ").split()[0]
                await temporal_client.get_workflow_handle(wid).describe()  # started
                if "--follow" in args:
                    head = f"[planning] {wid}"
                    await follower.read_until(lambda x, head=head: x.startswith(head), timeout=60)
                else:
                    await asyncio.sleep(1.0)  # waiting for the plan (no line until it is done)
                started = time.monotonic()
                code = await follower.interrupt(timeout=20)
                results[waiting] = (code, time.monotonic() - started, follower.output + "\n" + follower.err)
            finally:
                follower.stop()
        status = (await temporal_client.get_workflow_handle(wid).describe()).status.name
        await temporal_client.get_workflow_handle(wid).terminate()
    (c1, t1, out1), (c2, t2, out2) = results["waits for the plan"], results["follows"]
    assert c1 == 130 and t1 < EXIT_BOUND_S, (c1, t1, out1)
    assert f"stopped waiting for the plan of {wid}; the build goes on without this terminal" in out1, out1
    assert c2 == 130 and t2 < EXIT_BOUND_S and "(attached to the running pipeline)" in out2, (c2, t2, out2)
    assert f"stopped following {wid}; the build goes on without this terminal" in out2, out2
    assert status == "RUNNING"
