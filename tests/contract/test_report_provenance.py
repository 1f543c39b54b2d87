"""The report shows where each planned value came from: in plan mode, and collapsed in the final report."""

from __future__ import annotations

from domain.buildset import BuildRequest, CompatibilityRequest, plan_targets
from domain.models import BuildState, PipelineReport, TargetResult
from domain.report import report_markdown

from .helpers import COMMIT, HARBOR, OPS, contract, fixture_files, line_of

ASK = CompatibilityRequest(requested_by="alice", reason="report test")


def _report(**kw) -> PipelineReport:
    req = BuildRequest(architectures=["amd64"], variants=["standard"], compatibility_request=ASK)
    plan = plan_targets(contract(), req, build_commit=COMMIT, harbor_commit=HARBOR, cluster_archs=None,
                        image_repository_override=None)
    state = BuildState(base_commit=COMMIT, default_branch="main", harbor_commit=HARBOR, harbor_pinned={},
                       architectures=["amd64"], policies=[], disagreements=[],
                       fallbacks=["layer_ceiling.min_layers: config:build.min_layers (no row)"])
    return PipelineReport(workflow_id="wf", request=req, plan=plan, state=state, **kw)


def test_plan_report_has_a_provenance_row_per_field():
    text = report_markdown(_report(status="planned"))
    cpu_line = line_of(fixture_files()[OPS], "--cpu 48 --memory 512GB")
    assert f"| resources.cpu | `48` | {OPS}:{cpu_line} |" in text
    assert "| env.GHCR_TOKEN | `<secret:registry_token>` |" in text
    assert "bash -lc f=$(mktemp) && echo \"$BUILD_B64\" \\| base64" in text  # a | never breaks the table
    assert "Taken from configuration" in text and "config:build.min_layers" in text
    assert "<details>" not in text


def test_final_report_keeps_provenance_collapsed():
    done = TargetResult(key="amd64-standard", architecture="amd64", variant="standard", status="validated",
                        cluster="cw-rno2a", job_ids=["/u/j"], tag="t", image_ref="r:t")
    text = report_markdown(_report(status="merged", targets=[done]))
    assert "<details><summary>Where each planned value came from</summary>" in text
    assert "| timeout | `18000 s` |" in text


def test_final_report_says_what_the_rehearsal_proved():
    from rehearsal.result import RehearsalResult

    rep = _report(status="merged", targets=[TargetResult(
        key="amd64-standard", architecture="amd64", variant="standard", status="validated", cluster="cw-rno2a",
        job_ids=["/u/j"], tag="t", image_ref="r:t")])
    rep.plan[0].rehearsal = RehearsalResult(status="passed", seconds=0.8, tools=["apt-get", "/kaniko/executor"])
    text = report_markdown(rep)
    assert "- `amd64-standard` rehearsal passed in 0.8 s (stand-ins: apt-get, /kaniko/executor)" in text
    rep.plan[0].rehearsal = RehearsalResult(status="skipped", reason="bwrap is not installed on this worker")
    assert "- `amd64-standard` rehearsal skipped: bwrap is not installed on this worker" in report_markdown(rep)
