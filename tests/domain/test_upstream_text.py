"""Upstream (Harbor) text is inert and capped (issue #21 item 6): dependency text lands in the PR body
and the report like operator text does, and a 1.5 MB value is cut with a note where it enters history,
so no payload-limit retry loop can start."""

from __future__ import annotations

from domain.models import MAX_UPSTREAM_LINE, HarborDiffSummary


def test_a_one_and_a_half_megabyte_harbor_value_is_capped_with_a_note():
    huge = "harbor[all] adds dep-x==" + "9" * 1_500_000
    diff = HarborDiffSummary(old="a" * 40, new="b" * 40, affects_image=True, lines=[huge] + [f"l{i}" for i in range(500)])
    payload = diff.model_dump_json()
    assert len(payload) < 16_000  # far under Temporal's 2 MB payload limit (and its 512 KB warning)
    assert diff.lines[0].startswith(huge[:MAX_UPSTREAM_LINE]) and "more characters cut" in diff.lines[0]
    assert diff.lines[-1].startswith("… 301 more lines cut")
    assert HarborDiffSummary.model_validate_json(payload) == diff  # stable across a round trip (replay)


def test_harbor_text_is_inert_in_the_pr_body(tmp_path):
    from activities.record import RecordActivities
    from domain.models import SourceSnapshot
    from tests.activities.test_record_guard import _config, _inp
    from tests.fixtures_git import fresh_remotes

    remotes = fresh_remotes(tmp_path / "remotes")
    inp = _inp(remotes)
    hostile = "dep-y: @marin-community/maintainers closes #12 <img src=x onerror=alert(1)> [x](https://evil.example)"
    src = inp.source.model_copy(update={"harbor_diff": HarborDiffSummary(old="a" * 40, new="b" * 40,
                                                                         affects_image=True, lines=[hostile])})
    body = RecordActivities(_config(tmp_path, remotes))._pr_body(inp.model_copy(update={"source": src}))
    line = next(x for x in body.splitlines() if "dep-y" in x)
    assert "@marin-community" not in line and "closes #12" not in line and "<img" not in line
    assert "](https://" not in line
    assert isinstance(src, SourceSnapshot)


def test_a_service_unreachable_past_the_budget_exits_3_as_documented():
    """issue #21 item 7: Iris, the registry or GitHub unreachable for the whole budget is exit 3, not 1."""
    from domain.buildset import BuildRequest, CompatibilityRequest
    from domain.models import PipelineReport
    from domain.outcome import step_failure
    from runtime.operator_client import EXIT_FAILED, EXIT_UNREACHABLE, exit_code

    req = BuildRequest(architectures=["amd64"], compatibility_request=CompatibilityRequest(requested_by="a", reason="b"))
    for error_type in ("PreflightUnavailable", "Transient"):
        failure = step_failure(error_type, "iris controller (clusters.c): cannot reach the controller", step="preflight",
                               request=req)
        assert failure.failure_class == "unreachable" and "build again" in failure.next_step
        rep = PipelineReport.model_construct(status="failed", failure=failure)
        assert exit_code(rep) == EXIT_UNREACHABLE
    internal = step_failure("RuntimeError", "boom", step="preflight", request=req)
    assert exit_code(PipelineReport.model_construct(status="failed", failure=internal)) == EXIT_FAILED
