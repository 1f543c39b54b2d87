"""Operator-facing text: input rules, terminal-safe text, outcome details and the progress views."""

from __future__ import annotations

import io
import os

import pytest
from rich.console import Console

from domain.buildset import BuildRequest, CompatibilityRequest
from domain.models import JobProgress, PipelineReport, Stage, TargetStatus, WaitingReason
from domain.operator_input import OperatorInputError, build_request, request_differences
from domain.outcome import build_command, details_markdown, find_location, input_failure
from domain.terminal_text import printable, shorten
from runtime.progress import HEARTBEAT_S, LiveView, PlainView, rows, waits


def _req(**kw) -> BuildRequest:
    base = dict(architectures=["amd64"], variants=["standard"], requested_by=" ana ", reason=" needs it ")
    return build_request(**{**base, **kw})


def test_build_request_trims_and_refuses_bad_text_naming_the_flag():
    req = _req()
    assert req.compatibility_request == CompatibilityRequest(requested_by="ana", reason="needs it")
    for kw, flag in ((dict(requested_by="  "), "--requested-by"), (dict(reason="x" * 2001), "--reason"),
                     (dict(reason=os.fsdecode(b"\xff")), "--reason"), (dict(reason="a\x1b[2Jb"), "--reason"),
                     (dict(architectures=["amd64", "amd64"]), "--arch"), (dict(clusters=["amd64"]), "--cluster"),
                     (dict(requested_by=None), "--requested-by")):
        with pytest.raises(OperatorInputError, match=flag.replace("-", r"\-")):
            _req(**kw)


def test_request_differences_ignore_who_and_why_but_name_what_changes_the_images():
    a, b = _req(), _req(requested_by="bob", reason="other words")
    assert request_differences(a, b) == []
    c = _req(architectures=["amd64", "riscv64"], clusters=["amd64=x"])
    assert request_differences(a, c) == ["architectures: running ['amd64'], requested ['amd64', 'riscv64']",
                                         "clusters: running {}, requested {'amd64': 'x'}"]


def test_printable_strips_escape_sequences_and_controls():
    assert printable("ok\x1b[2J\x1b]0;title\x07 done\x00\x9b31m") == "ok done"
    assert printable("a\nb\tc") == "a b c" and printable("a\nb", multiline=True) == "a\nb"
    assert shorten("x" * 10, 5) == "xxxx…"


def test_failure_location_and_next_step_name_the_file_and_the_command():
    assert find_location("docker/build_gpu_rl_kaniko.sh:31: expected x") == "docker/build_gpu_rl_kaniko.sh:31"
    assert find_location("cannot reach 127.0.0.1:8233") is None
    f = input_failure("InputError", "AGENTS.md:4: expected a pin", _req(reason="it's needed"))
    assert f.location == "AGENTS.md:4" and f.failure_class == "input"
    assert build_command(_req(reason="it's needed")) in f.next_step
    assert "--reason 'it'\"'\"'s needed'" in f.next_step  # shell-quoted: the command can be pasted as is
    assert input_failure("InputError", "unknown architecture 'riscv64'", _req()).next_step.startswith("fix `--arch`")
    assert input_failure("InputError", "--cluster amd64=x: not configured", _req()).next_step.startswith(
        "fix `--cluster`")
    md = details_markdown(title="t", stage=Stage.FAILED, failure=f)
    assert "stage **failed**" in md and "**Next step:**" in md


def _status(stage=Stage.RUNNING, waiting=None, marker="step 3") -> TargetStatus:
    return TargetStatus(key="amd64-standard", stage=stage, job_ids=["/u/gpu-rl-amd64-standard-abc"],
                        progress=JobProgress(job_id="/u/gpu-rl-amd64-standard-abc", state="running", terminal=False,
                                             elapsed_s=75, last_marker=marker),
                        waiting=waiting)


WAIT = WaitingReason(kind="package_visibility", target="amd64-standard", detail="make the package public",
                     command="python starter.py recheck wid amd64-standard")


def test_plain_view_prints_on_change_and_at_least_every_heartbeat():
    out, now = [], [0.0]
    view = PlainView(out.append, clock=lambda: now[0])
    rep = PipelineReport(workflow_id="wid", status="running", request=_req())
    statuses = {"amd64-standard": _status()}
    view.update("wid", "running", rows(rep, statuses), [])
    assert out[0].startswith("[running] wid") and out[1].startswith("  amd64-standard: running | job ")
    assert "1m15s" in out[1] and "step 3" in out[1]
    n = len(out)
    now[0] = 10.0
    view.update("wid", "running", rows(rep, statuses), [])
    assert len(out) == n  # nothing changed, no heartbeat due
    now[0] = 10.0 + HEARTBEAT_S
    view.update("wid", "running", rows(rep, statuses), [])
    assert len(out) > n  # once a minute even when idle
    statuses = {"amd64-standard": _status(Stage.WAITING, WAIT, marker="\x1b[31mred\x1b[0m")}
    view.update("wid", "waiting", rows(rep, statuses), waits(rep, statuses))
    assert "  run: python starter.py recheck wid amd64-standard" in out
    assert not any("\x1b" in line for line in out)
    assert all(len(line) <= 200 for line in out)


def test_live_view_draws_a_table_with_the_unblocking_command():
    buf = io.StringIO()
    view = LiveView(Console(file=buf, force_terminal=True, width=160))
    statuses = {"amd64-standard": _status(Stage.WAITING, WAIT)}
    view.update("wid", "waiting", rows(None, statuses), waits(None, statuses))
    view.close()
    text = buf.getvalue()
    for col in ("target", "stage", "job", "elapsed", "last marker", "waiting for"):
        assert col in text
    assert "python starter.py recheck wid amd64-standard" in text and "\x1b[" in text  # drawn for a terminal
