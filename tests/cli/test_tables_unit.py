"""The table renderer and the status query, without a server: aligned plain columns off a terminal,
rich on one (cells literal, never markup), UTC times and short durations, and the BuildKind default."""

from __future__ import annotations

import io
from datetime import UTC, datetime, timedelta, timezone

from runtime import listing, search_attributes, tables
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
