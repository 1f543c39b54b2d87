"""Issue 38.5, the pieces of `follow` that need no services: identical waits grouped with one runnable
command, every wait with a next step, elapsed times that tick, "a worker is polling" only on proof, and
the few-line summary at the end."""

from __future__ import annotations

import subprocess

from domain.models import (
    JobProgress,
    PipelineReport,
    PullRequestInfo,
    Stage,
    TargetResult,
    TargetStatus,
    WaitingReason,
)
from domain.outcome import recheck_command
from runtime import progress
from tests.workflows.standins import plan, request

WID = "gpu-rl-build-0123456789ab-0123456789ab"
KEYS = ["amd64-standard", "amd64-megatron", "arm64-standard", "arm64-megatron"]


def _visibility(key: str) -> WaitingReason:
    return WaitingReason(kind="package_visibility", target=key, command=recheck_command(WID, key),
                         detail="ghcr.io/marin-community/marinskyrl is not anonymously pullable: make the package "
                                "public (GitHub → Packages → Package settings → Change visibility → Public), "
                                "then re-check")


def test_four_identical_waits_are_one_block_with_one_command_that_runs_as_printed(tmp_path):
    lines = progress.wait_lines([_visibility(k) for k in KEYS], width=80)
    assert sum(line.startswith("WAITING") for line in lines) == 1, lines
    assert all(k in lines[0] for k in KEYS), lines  # (the live view wraps this text; commands are split below)
    assert all(len(line) <= 80 for line in lines[1:]), lines
    command = " ".join(line.strip().removesuffix("\\").strip() for line in lines[lines.index("  run:") + 1:])
    # The command as printed (continuation lines and all) recheck every target, each exactly once.
    fake = tmp_path / "python"
    fake.write_text('#!/bin/sh\nshift\necho "$*"\n')
    fake.chmod(0o755)
    text = "\n".join(line.removeprefix("    ") for line in lines[lines.index("  run:") + 1:])
    ran = subprocess.run(["bash", "-c", text], capture_output=True, text=True, check=True,
                         env={"PATH": f"{tmp_path}:/usr/bin:/bin"})
    assert ran.stdout.splitlines() == [f"recheck {WID} {k}" for k in KEYS], (command, ran.stdout)


def test_different_waits_stay_apart_and_every_wait_has_a_next_step():
    merge = WaitingReason(kind="merge_checks", detail="PR #7 (https://x/7): ci is failing (required)")
    lines = progress.wait_lines([_visibility("amd64-standard"), merge], width=80)
    assert [line for line in lines if line.startswith("WAITING")] == [
        lines[0], "WAITING PR #7 (https://x/7): ci is failing (required)"]
    assert lines[-1].startswith("  next: push a fix to the PR's branch"), lines
    assert lines[1].startswith("  run:") and "recheck" in lines[2]


def test_elapsed_times_tick_between_changes_and_stop_at_the_end():
    now = [100.0]
    ticker = progress.Ticker(clock=lambda: now[0])
    running = JobProgress(job_id="j", state="running", terminal=False, elapsed_s=27)
    st = {"amd64-standard": TargetStatus(key="amd64-standard", stage=Stage.RUNNING, job_ids=["/u/j"],
                                         progress=running)}
    assert progress.rows(None, st, ticker)[0].elapsed == "0m27s"
    now[0] += 67  # issue 38: 0m27s was still shown 67 s later
    assert progress.rows(None, st, ticker)[0].elapsed == "1m34s"
    st["amd64-standard"].progress = running.model_copy(update={"elapsed_s": 100})  # a new observation
    assert progress.rows(None, st, ticker)[0].elapsed == "1m40s"
    st["amd64-standard"].progress = running.model_copy(update={"elapsed_s": 120, "state": "succeeded",
                                                              "terminal": True})
    now[0] += 1000
    assert progress.rows(None, st, ticker)[0].elapsed == "2m00s"


def test_a_worker_is_said_to_poll_again_only_when_one_answered():
    q = "gpu-rl-builder"
    gone = f"no worker is polling {q} (no worker answered a query within 5 s)"
    note, state = progress.worker_note(None, gone, answered=False, task_queue=q)
    assert note == gone and state == gone
    # The query now fails at once (no poller) and a dead poller is still listed: no fast sign fires. Today
    # that printed "a worker is polling … again" with no worker alive.
    assert progress.worker_note(state, None, answered=False, task_queue=q) == (None, gone)
    note, state = progress.worker_note(state, None, answered=True, task_queue=q)
    assert note.startswith(f"a worker is polling {q} again") and state is None
    assert progress.worker_note(None, None, answered=True, task_queue=q) == (None, None)


def test_follow_ends_with_a_few_lines_and_a_pointer_to_the_report():
    targets = plan(request(archs=("amd64", "arm64"), variants=("standard", "megatron")))
    rep = PipelineReport(
        workflow_id=WID, status="merged", request=request(), plan=targets, merge_commit="m" * 40,
        pull_request=PullRequestInfo(number=12, url="https://github.com/o/MarinSkyRL/pull/12", head_sha="h" * 40,
                                     merged=True),
        targets=[TargetResult(key=t.key, architecture=t.architecture, variant=t.variant, status="validated",
                              cluster="c", job_ids=["/u/j"], tag="t", image_ref="r:t",
                              digest="sha256:" + f"{i}" * 64) for i, t in enumerate(targets)])
    lines = progress.summary_lines(rep, 80)
    assert 4 <= len(lines) <= 6 and all(len(line) <= 80 for line in lines), lines
    assert lines[0] == f"merged: {WID} — merge commit mmmmmmmmmmmm", lines
    assert lines[1] == "PR #12 https://github.com/o/MarinSkyRL/pull/12", lines
    text = "\n".join(lines)
    assert all(t.key in text for t in targets) and "sha256:000000000000" in text
    assert lines[-1] == f"full report: python starter.py report {WID}"


def test_printed_operator_commands_fill_by_from_the_environment(monkeypatch):
    """`--by <your-name>` does not run as printed (a shell redirection); with $GPU_RL_BUILDER_OPERATOR set
    the printed command carries the login."""
    from domain.outcome import approve_command

    wait = WaitingReason(kind="merge_authorization", detail="PR #7 is green: an operator authorizes the merge",
                         command=approve_command(WID))
    monkeypatch.delenv("GPU_RL_BUILDER_OPERATOR", raising=False)
    assert progress.wait_lines([wait])[1] == f"  run: python starter.py approve-merge {WID} --by <your-name>"
    monkeypatch.setenv("GPU_RL_BUILDER_OPERATOR", "sandbox-operator")
    assert progress.wait_lines([wait])[1] == f"  run: python starter.py approve-merge {WID} --by sandbox-operator"
