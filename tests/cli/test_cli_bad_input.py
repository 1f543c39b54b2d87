"""Every bad input of issue 12, through ``starter.py`` as an operator types it: one line on stderr, no
traceback, the right exit code (2 bad input, 1 refused/failed, 3 unreachable), and nothing created.
"""

from __future__ import annotations

import datetime
import json
import os
import re
import subprocess
import uuid

import pytest
from temporalio.worker import UnsandboxedWorkflowRunner, Worker

from domain.models import PipelineInput, RebuildCheckInput
from tests.cli.starter_cli import starter, starters
from tests.cli.test_cli_attach import PipelineStandin, _idle_queue_config, _queue_of
from tests.visibility import workflows_started_on
from tests.workflows.standins import request
from workflows.pipeline import BuildPipelineWorkflow
from workflows.rebuild import RebuildCheckWorkflow

pytestmark = pytest.mark.stack

OK_REQUEST = ("--requested-by", "tester", "--reason", "bad input test")
BUILD = ("build", "--arch", "amd64", "--variant", "standard", "--cluster", "amd64=sandbox-amd64")


def one_line_error(ran, code: int, *needles: str) -> None:
    assert ran.code == code, ran.text
    lines = ran.err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), ran.err
    assert "Traceback" not in ran.text
    for needle in needles:
        assert needle in lines[0], (needle, lines[0])


def _branches(url: str) -> set[str]:
    out = subprocess.run(["git", "ls-remote", "--heads", url], capture_output=True, text=True, check=True).stdout
    return {line.split("\t")[1] for line in out.splitlines()}


async def test_bad_operator_text_is_refused_before_anything_is_started(service_config):
    s = service_config
    cfg = s.config_path
    non_utf8 = os.fsdecode(b"needs \xff\xfe image")  # how Python hands non-UTF-8 argv bytes to click
    cases = [
        ((*BUILD, "--requested-by", "   ", "--reason", "x"), "--requested-by"),
        ((*BUILD, "--requested-by", "tester", "--reason", " \t "), "--reason"),
        ((*BUILD, "--requested-by", "tester", "--reason", "x" * 100_000), "--reason: 100000 characters"),
        ((*BUILD, "--requested-by", "tester", "--reason", non_utf8), "--reason: not valid UTF-8"),
        ((*BUILD, "--requested-by", "tester", "--reason", "bell\x07 and \x1b[2J"), "control character"),
        ((*BUILD, *OK_REQUEST, "--harbor-ref", "no-such-branch"), "--harbor-ref no-such-branch"),
        (("build", "--arch", "amd64", "--cluster", "amd64", *OK_REQUEST), "--cluster"),
        (("schedule", "create", "s-bad", "--every", "0", "--arch", "amd64", *OK_REQUEST), "--every"),
        (("schedule", "create", "s-bad", "--cron", "0 2 * * *", "--arch", "amd64", "--requested-by", " ",
          "--reason", "r"), "--requested-by"),
        (("approve-merge", "any-id", "--by", "  "), "--by"),
        (("decide", "any-id", "amd64-standard", "retry", "--by", non_utf8), "--by"),
        # #21.5: only a configured operator ([operators] logins; sandbox: tester, ...) approves or decides.
        (("approve-merge", "any-id", "--by", "mallory"), "--by mallory: not a configured operator"),
        (("decide", "any-id", "amd64-standard", "retry", "--by", "mallory"), "--by mallory: not a configured operator"),
    ]
    ran = await starters(cfg, *(args for args, _ in cases))  # independent: side by side, checked one by one
    for (_, needle), result in zip(cases, ran, strict=True):
        one_line_error(result, 2, needle)
    assert await workflows_started_on(s.client, s.task_queue) == []
    assert [sc async for sc in await s.client.list_schedules() if sc.id == "s-bad"] == []


async def test_an_unset_api_key_variable_is_bad_input_not_unreachable(service_config, tmp_path):
    text = service_config.config_path.read_text()
    text = re.sub(r"(\[temporal\]\n)", r'\1api_key = { kind = "env", name = "GPU_RL_TEST_UNSET_KEY" }\n', text)
    assert "GPU_RL_TEST_UNSET_KEY" in text
    cfg = tmp_path / "apikey.toml"
    cfg.write_text(text)
    for ran in await starters(cfg, (*BUILD, *OK_REQUEST), ("report", "any-id")):
        one_line_error(ran, 2, "GPU_RL_TEST_UNSET_KEY")


async def test_commands_on_unknown_finished_or_foreign_ids_print_one_line(service_config, tmp_path):
    s = service_config
    cfg = _idle_queue_config(s, tmp_path)  # nobody serves it: workflows stay as started
    queue = re.search(r'task_queue = "([^"]*)"', cfg.read_text()).group(1)
    u = uuid.uuid4().hex[:8]
    finished, foreign = f"gpu-rl-build-finished-{u}", f"foreign-{u}"
    await s.client.start_workflow(BuildPipelineWorkflow.run, PipelineInput(request=request(), request_id=finished),
                                  id=finished, task_queue=queue)
    await s.client.get_workflow_handle(finished).terminate(reason="test: a finished build")
    await s.client.start_workflow(RebuildCheckWorkflow.run, RebuildCheckInput(request=request()), id=foreign,
                                  task_queue=queue)
    try:
        # Independent commands, run side by side; each result is checked on its own below.
        unknown = (("approve-merge", f"nope-{u}", "--by", "tester"),
                   ("decide", f"nope-{u}", "amd64-standard", "retry", "--by", "tester"),
                   ("recheck", f"nope-{u}", "amd64-standard"), ("cancel", f"nope-{u}"), ("report", f"nope-{u}"),
                   ("follow", f"nope-{u}"))
        foreign_cmds = (("approve-merge", foreign, "--by", "tester"), ("cancel", foreign),
                        ("recheck", foreign, "amd64-standard"), ("follow", foreign))
        finished_cmds = (("approve-merge", finished, "--by", "tester"), ("cancel", finished))
        ran = await starters(cfg, *unknown, *foreign_cmds, ("report", foreign), *finished_cmds,
                             ("decide", finished, "amd64-standard", "retry", "--by", "tester"),
                             ("status", "--query", "BuildStage = = 'x'"), ("report", finished))
        for r in ran[:len(unknown)]:
            one_line_error(r, 2, f"nope-{u}", "no such workflow")
        ran = ran[len(unknown):]
        for r in ran[:len(foreign_cmds)]:
            one_line_error(r, 2, foreign, "RebuildCheckWorkflow")
        check, *ran = ran[len(foreign_cmds):]  # a rebuild check has a report too: its decision so far
        assert check.code == 0 and check.out.startswith(f"rebuild check {foreign}: running"), check.text
        assert "checking (running)" in check.out
        for r in ran[:len(finished_cmds)]:
            one_line_error(r, 1, finished, "already finished (terminated)")
        decided, queried, rep = ran[len(finished_cmds):]
        one_line_error(decided, 2, "no target")
        one_line_error(queried, 2, "--query")

        # A finished build's report is read from its history: no worker serves this queue.
        assert rep.code == 1 and "— failed" in rep.out and "terminated" in rep.err, rep.text
    finally:
        await s.client.get_workflow_handle(foreign).terminate(reason="test cleanup")


async def test_schedule_refusals_bad_cron_out_of_range_duplicate_and_unknown_arch(service_stack):
    s = service_stack
    cfg = s.config_path
    sid = f"s-{uuid.uuid4().hex[:8]}"
    base = ("--arch", "amd64", "--variant", "standard", "--cluster", "amd64=sandbox-amd64", *OK_REQUEST)
    try:
        one_line_error(await starter(cfg, "schedule", "create", sid, "--cron", "not a cron", *base), 2, sid)
        one_line_error(await starter(cfg, "schedule", "create", sid, "--cron", "0 25 * * *", *base), 2, sid)
        one_line_error(await starter(cfg, "schedule", "create", sid, "--cron", "0 2 * * *", "--arch", "riscv64",
                                     "--variant", "standard", *OK_REQUEST), 2, "riscv64")
        assert [sc async for sc in await s.client.list_schedules() if sc.id == sid] == []

        created = await starter(cfg, "schedule", "create", sid, "--cron", "0 2 * * *", *base)
        assert created.code == 0, created.text
        # Sequential above: creates of one id share its validation plan. These two share nothing.
        duplicate, unknown = await starters(cfg, ("schedule", "create", sid, "--cron", "0 3 * * *", *base),
                                            ("schedule", "describe", f"{sid}-nope"))
        one_line_error(duplicate, 2, f"schedule {sid} already exists")
        one_line_error(unknown, 1, f"{sid}-nope")
    finally:
        await starter(cfg, "schedule", "delete", sid)


async def test_unknown_architecture_exits_2_with_or_without_follow_and_submits_nothing(service_stack):
    s = service_stack
    before = _branches(s.remotes.marinskyrl_url)
    since = datetime.datetime.now(datetime.UTC).isoformat()
    args = ("build", "--arch", "riscv64", "--variant", "standard", *OK_REQUEST)
    extras = ((), ("--follow",), ("--plan",))
    for ran in await starters(s.config_path, *((*args, *extra) for extra in extras), timeout=120):
        assert ran.code == 2, ran.text
        errors = [line for line in ran.err.splitlines() if line.startswith("error: ")]
        assert len(errors) == 1 and "riscv64" in errors[0] and "next step" in errors[0], ran.err
        assert "--arch" in errors[0] and "Traceback" not in ran.text
    assert _branches(s.remotes.marinskyrl_url) == before  # no build branch pushed
    # Every sandbox cluster declares its architecture, so the configuration alone refuses riscv64: no
    # pipeline was started (test_cli_plan_unreachable covers the refusal planning makes).
    started = await workflows_started_on(s.client, s.task_queue, since=since)
    assert started == [], started


async def test_a_different_request_for_the_running_commits_is_refused_naming_the_difference(service_config,
                                                                                             tmp_path):
    s = service_config
    cfg = _idle_queue_config(s, tmp_path)
    # A stand-in pipeline serves the queue (build refuses a queue nobody polls): it says it is running and
    # waits, so the pipeline stays running for the comparison without costing a build.
    async with Worker(s.client, task_queue=_queue_of(cfg), workflows=[PipelineStandin],
                      workflow_runner=UnsandboxedWorkflowRunner()):
        first = await starter(cfg, *BUILD, *OK_REQUEST)
        assert first.code == 0, first.text
        wid = first.out.splitlines()[0].removeprefix("workflow: ").split()[0]
        try:
            other = await starter(cfg, "build", "--arch", "amd64", "--arch", "arm64", "--variant", "standard",
                                  "--cluster", "amd64=sandbox-amd64", *OK_REQUEST)
            one_line_error(other, 2, wid, "architectures: running ['amd64'], requested ['amd64', 'arm64']")
            same = await starter(cfg, *BUILD, "--requested-by", "bob", "--reason", "same images, other words")
            assert same.code == 0 and "(attached to the running pipeline)" in same.out, same.text
            as_json = await starter(cfg, *BUILD, *OK_REQUEST, "--json")  # stdout: one JSON document, nothing else
            assert as_json.code == 0 and json.loads(as_json.out) == {"workflow_id": wid, "status": "running",
                                                                     "stage": "running"}, as_json.text
            assert "(attached to the running pipeline)" in as_json.err
        finally:
            await s.client.get_workflow_handle(wid).terminate(reason="test cleanup")
