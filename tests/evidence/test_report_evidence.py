"""Reports and PR bodies name evidence by store URI and sha256, and quote the failing line."""

from __future__ import annotations

from domain.buildset import BuildRequest, CompatibilityRequest
from domain.models import FailureRecord, FileRef, LogCheck, PipelineReport, TargetResult
from domain.report import evidence_lines, report_markdown

LOG = FileRef(uri="s3://evidence/builds/req/job.log", sha256="ab" * 32, size_bytes=2048)
DIAG = FileRef(uri="s3://evidence/builds/req/job.diagnostics.json", sha256="cd" * 32, size_bytes=512)


def _targets() -> list[TargetResult]:
    failure = FailureRecord(job_id="/u/job-a", failure_class="preemption", reasons=["k8s: Preempted"],
                            decision="retry", diagnostics=DIAG, log=LOG, failing_line="exit status 3")
    check = LogCheck(log=LOG, found=[], missing=[], final_push_seen=True, pushed_digest=None)
    return [TargetResult(key="amd64-standard", architecture="amd64", variant="standard", status="validated",
                         cluster="c", job_ids=["/u/job-a", "/u/job-b"], tag="t", image_ref="r:t",
                         log_check=check, failures=[failure])]


def test_evidence_lines_give_uri_digest_and_size_for_build_logs_and_diagnostics():
    lines = evidence_lines(_targets())
    assert lines == [
        f"- amd64-standard build log: `{LOG.uri}` (sha256 `{LOG.sha256[:16]}…`, 2.0 KiB)",
        f"- amd64-standard `/u/job-a` preemption diagnostics: `{DIAG.uri}` (sha256 `{DIAG.sha256[:16]}…`, 512 B)",
    ]


def test_the_report_quotes_the_failing_line_and_names_the_store_not_a_path():
    rep = PipelineReport(workflow_id="w", status="awaiting_merge", request=BuildRequest(
                         architectures=["amd64"], compatibility_request=CompatibilityRequest(requested_by="a", reason="b")),
                         targets=_targets())
    text = report_markdown(rep)
    assert "preemption → retry: `exit status 3`" in text
    assert DIAG.uri in text and LOG.uri in text and DIAG.sha256[:16] in text


def test_the_report_shows_a_lost_log_and_what_stood_in_for_an_incomplete_one():
    """Issue #26: a target whose log lost lines shows why, which image evidence stood in, and a log_lost
    failure shows its class and first reason."""
    why = "the image cannot stand in for the lost log: no image at r:t (digest expected digest of tag t, ...)"
    lost = FailureRecord(job_id="/u/job-a", failure_class="log_lost", reasons=[why], decision="fail",
                         diagnostics=DIAG, log=LOG)
    stood = LogCheck(log=LOG, found=["uv sync layer 0 done"], missing=[], final_push_seen=True, pushed_digest=None,
                     incomplete=["the log store holds no line of the job (a succeeded build always prints)"],
                     stood_in={"uv sync layer 0 done": "image config history: the docker/Dockerfile step that prints it"})
    failed = LogCheck(log=LOG, found=[], missing=["uv sync layer 0 done"], final_push_seen=False, pushed_digest=None,
                      incomplete=stood.incomplete, lost=[why])
    targets = [
        TargetResult(key="amd64-standard", architecture="amd64", variant="standard", status="validated", cluster="c",
                     job_ids=["/u/job-b"], tag="t", image_ref="r:t", log_check=stood),
        TargetResult(key="arm64-standard", architecture="arm64", variant="standard", status="failed", cluster="c",
                     job_ids=["/u/job-a"], tag="t", image_ref="r:t", log_check=failed, failures=[lost]),
    ]
    rep = PipelineReport(workflow_id="w", status="failed", request=BuildRequest(
                         architectures=["amd64", "arm64"],
                         compatibility_request=CompatibilityRequest(requested_by="a", reason="b")), targets=targets)
    text = report_markdown(rep)
    assert f"- arm64-standard: `/u/job-a` log_lost → fail — {why}" in text
    assert ("- amd64-standard build log incomplete: the log store holds no line of the job (a succeeded build "
            "always prints)") in text
    assert "  - uv sync layer 0 done: proven by image config history: the docker/Dockerfile step" in text
    assert "  - uv sync layer 0 done: proven by nothing (log_lost)" in text
