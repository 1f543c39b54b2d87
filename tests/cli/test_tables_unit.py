"""The table renderer and the status query, without a server: aligned plain columns off a terminal,
rich on one (cells literal, never markup), UTC times and short durations, and the BuildKind default;
fitted to a terminal's width: an id never cut or wrapped, words never split, the columns left out
named; follow's live table at 80 columns with every field, and its commands split only between
arguments so they paste and run."""

from __future__ import annotations

import io
import re
import subprocess
from datetime import UTC, datetime, timedelta, timezone

from domain import outcome
from domain.buildset import BuildRequest
from domain.models import JobProgress, Stage, TargetStatus, WaitingReason
from runtime import listing, progress, search_attributes, tables
from sandbox.temporal_server import SEARCH_ATTRIBUTES


class _Tty(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_plain_columns_are_aligned_with_upper_case_headers():
    out = io.StringIO()
    tables.render(["workflow", "stage"], [["a-long-workflow-id", "done"], ["b", "[waiting]"]], stream=out)
    assert out.getvalue().splitlines() == ["WORKFLOW            STAGE", "a-long-workflow-id  done",
                                           "b                   [waiting]"]


def test_on_a_terminal_rich_draws_it_and_keeps_brackets_literal():
    out = _Tty()
    tables.render(["workflow", "stage"], [["gpu-rl-build-x", "[done]"]], stream=out)
    text = out.getvalue()
    assert "workflow" in text and "gpu-rl-build-x" in text and "[done]" in text


def test_times_are_utc_to_the_second_and_durations_short():
    t = datetime(2026, 12, 2, 4, 5, 6, tzinfo=timezone(timedelta(hours=1)))
    assert tables.when(t) == "2026-12-02 03:05:06" and tables.when(None) == "-"
    assert [tables.duration(s) for s in (None, 65, 7260, 3 * 86400 + 4 * 3600)] == ["-", "1m05s", "2h01m", "3d04h"]
    assert tables.when(datetime(2026, 1, 1, tzinfo=UTC)) == "2026-01-01 00:00:00"


def test_status_lists_builds_only_unless_asked():
    assert listing.status_query(None, False) == (
        "(WorkflowType = 'BuildPipelineWorkflow') AND (BuildKind = 'build' OR BuildKind IS NULL)")
    assert listing.status_query("BuildStage = 'waiting'", False).startswith("(BuildStage = 'waiting') AND (BuildKind")
    assert listing.status_query("BuildKind = 'plan'", False) == "BuildKind = 'plan'"
    assert listing.status_query(None, True) == listing.ALL_KINDS_QUERY
    assert listing.status_query("BuildStage = 'waiting'", True) == "BuildStage = 'waiting'"


def test_buildkind_is_registered_wherever_the_others_are():
    assert {k.name for k in search_attributes.ALL} == set(SEARCH_ATTRIBUTES)
    assert "BuildKind" in SEARCH_ATTRIBUTES
    assert {k.value for k in search_attributes.BuildKind} == {"build", "plan", "validation", "rebuild-check"}


# ----------------------------------------------------------------------------- fitting a terminal
ANSI = re.compile(r"\x1b\[[0-9;]*m")
ID = "gpu-rl-build-0123456789ab-0123456789ab"  # domain.models.pipeline_id's shape (38 characters)
LONG_ID = f"{ID}-plan-schedule-nightly-amd64"  # a schedule's validation: 66 characters


def _row(wid: str, status: str = "completed") -> list[str]:
    return [wid, "build", status, "waiting", "validation_inconclusive", "2026-12-04 14:00:00", "(running)", "1h02m",
            listing.waiting_for("waiting", "validation_inconclusive", "running")]


def _drawn(rows, width: int) -> list[str]:
    out = _Tty()
    tables.render(listing.STATUS_HEADERS, rows, stream=out, drop=listing.STATUS_DROP, width=width)
    return ANSI.sub("", out.getvalue()).splitlines()


def test_status_at_80_columns_keeps_every_id_whole_on_one_line_and_says_what_it_left_out():
    ids = [f"{ID[:-2]}{i:02d}" for i in range(3)]
    lines = _drawn([_row(i) for i in ids], 80)
    assert all(len(line) <= 80 for line in lines), lines
    for wid in ids:
        assert any(line.split()[:1] == [wid] for line in lines), lines  # the id begins a line, uncut
    note = " ".join(lines[next(i for i, line in enumerate(lines) if line.startswith("(at 80 columns without: ")):])
    assert "kind" in note and note.endswith("--json shows every field)")
    header = next(line for line in lines if "workflow" in line)
    assert "stage" in header and "waiting for" in header  # what the operator needs most stays
    assert "the registry," in "\n".join(lines) and "then recheck" in "\n".join(lines)  # issue 38.5, wrapped


def test_columns_wrap_between_words_only_and_a_wide_terminal_shows_every_column():
    lines = _drawn([_row(ID)], 200)
    assert all(h in "\n".join(lines) for h in listing.STATUS_HEADERS) and not any("without:" in x for x in lines)
    for width in (100, 120, 140):
        text = "\n".join(_drawn([_row(ID)], width))
        header = next(line for line in text.splitlines() if "workflow" in line)
        assert "validation_inconclusive" in text or "failure class" not in header  # shown whole, or not at all
        assert all(len(line) <= width for line in text.splitlines())


def test_an_id_wider_than_the_table_can_hold_gets_a_line_of_its_own():
    lines = _drawn([_row(ID), _row(LONG_ID)], 60)
    assert ID in lines and LONG_ID in lines  # each alone on its line, whole
    assert "  stage: waiting" in lines and "  failure class: validation_inconclusive" in lines


def test_fit_columns_measures_what_rich_draws():
    headers, rows = ["id", "note"], [[ID, "a few words of free text"]]
    assert tables.fit_columns(headers, rows, 120) == [0, 1]
    assert tables.fit_columns(headers, rows, 50) == [0, 1]  # the note wraps between its words
    assert tables.fit_columns(headers, rows, 46, drop=["note"]) is None  # "words" would split: only the id left
    assert tables.fit_columns(headers, rows, 46, foldable=["note"]) == [0, 1]  # free text may fold


# ----------------------------------------------------------------------------- follow's live table
def _target(key: str, stage: Stage, failure_class: str | None = None, waiting: WaitingReason | None = None):
    return TargetStatus(key=key, stage=stage, failure_class=failure_class, waiting=waiting,
                        job_ids=["/gpu-rl-builder/gpurl-kaniko-amd64-megatron-0a1b2c3d-r2"],
                        progress=JobProgress(job_id="j", state="running", terminal=False, preemptions=1,
                                             last_marker="[arch] build host=x86_64", elapsed_s=754))


def _live(statuses, width: int) -> list[str]:
    from rich.console import Console

    out = io.StringIO()
    view = progress.LiveView(console=Console(file=io.StringIO(), width=width))
    try:
        rendered = view.render(ID, "waiting", progress.rows(None, statuses), progress.waits(None, statuses))
    finally:
        view.close()
    Console(file=out, width=width, color_system=None).print(rendered)
    return out.getvalue().splitlines()


def test_follow_at_80_columns_shows_every_field_and_the_whole_command():
    decide = WaitingReason(kind="operator_decision", target="amd64-megatron", detail="operator decision",
                           command=outcome.decide_command(ID, "amd64-megatron"))
    statuses = {"amd64-megatron": _target("amd64-megatron", Stage.WAITING, "validation_inconclusive", decide),
                "arm64-standard": _target("arm64-standard", Stage.RUNNING)}
    lines = _live(statuses, 80)
    text = "\n".join(lines)
    assert all(len(line) <= 80 for line in lines), text
    assert lines[0].startswith(f"{ID} — waiting")
    for word in ("amd64-megatron", "arm64-standard", "[validation_inconclusive]", "12m34s", "(running)",
                 "preempted×1", "[arch] build host=x86_64", "gpurl-kaniko-a…ron-0a1b2c3d-r2"):
        assert word in text, (word, text)
    # The command: split between arguments with continuations, the id whole; joined it is the command.
    run = lines[lines.index("  run:") + 1:]
    assert any(ID in line for line in run)
    assert " ".join(line.strip().removesuffix("\\").strip() for line in run) == outcome.decide_command(
        ID, "amd64-megatron")


def test_a_wide_terminal_gets_every_column_and_a_one_line_command():
    recheck = WaitingReason(kind="package_visibility", target="amd64-standard", detail="make it public",
                            command=outcome.recheck_command(ID, "amd64-standard"))
    lines = _live({"amd64-standard": _target("amd64-standard", Stage.WAITING, "visibility", recheck)}, 160)
    header = next(line for line in lines if line.startswith("target"))
    assert header.split() == ["target", "stage", "job", "elapsed", "last", "marker", "waiting", "for"]
    assert f"  run: {outcome.recheck_command(ID, 'amd64-standard')}" in lines


def test_a_split_command_runs_as_the_same_arguments_in_bash():
    request = BuildRequest(architectures=["amd64", "arm64"], variants=["standard"],
                           compatibility_request={"requested_by": "alice", "reason": "it's for marin#7920 — now"})
    command = outcome.build_command(request)
    lines = progress.shell_lines(command, 40)
    assert len(lines) > 2 and all(len(line) <= 40 for line in lines if " " in line)

    def argv(text: str) -> list[str]:
        return subprocess.run(["bash", "-c", "printf '%s\\n' " + text.removeprefix("python ")], check=True,
                              capture_output=True, text=True).stdout.splitlines()
    assert argv("\n".join(lines)) == argv(command)


def test_many_rows_are_measured_by_the_ones_that_decide_the_widths():
    rows = [_row(f"{ID[:-3]}{i:03d}") for i in range(300)] + [_row(LONG_ID)]
    assert tables.fit_columns(listing.STATUS_HEADERS, rows, 100, drop=listing.STATUS_DROP) == \
        tables.fit_columns(listing.STATUS_HEADERS, [_row(LONG_ID)], 100, drop=listing.STATUS_DROP)
    lines = _drawn(rows, 100)
    assert all(len(line) <= 100 for line in lines) and sum(1 for line in lines if ID[:-3] in line) == 301
