"""Every kind of stale fact the service reports is corrected in the build commit, line by line with why.

One case per kind (issue 39): the stale doc is reported, ``ops_fix`` names each corrected line as
``file:line``, the corrected doc read again holds no residual of it, and the report and the PR body list
the correction. Fixture cases edit the sandbox fixture's ops doc; the credential, unread-variable and
launcher-pin cases use the real era-C and era-B docs as they are.
"""

from __future__ import annotations

import re

import pytest

from activities.record import RecordActivities
from domain.buildset import BuildRequest, CompatibilityRequest
from domain.contract import UncorrectableProse, load_contract, ops_fix
from domain.models import BundleSummary, PipelineReport, RecordInput, SourceSnapshot, TargetResult
from domain.report import report_markdown

from .helpers import OPS, contract, edited, fixture_files, line_of
from .real import commit_tree, files_at, line_in

LAUNCHER = "cloud/iris/launch_rl_iris.py"
AMD_WHEEL = '  -e WHEEL_SOURCE wheel-builder \\\n  -- bash -lc \'f=$(mktemp)'


def _fixture(edit):
    files = edited(OPS, edit)
    return files, contract(files)


# kind -> (edit of the fixture doc, the disagreement field, a needle of the stale line, residual check)
FIXTURE_KINDS = {
    "required row the script does not require": (
        lambda t: t, "build contract: HF_TOKEN", "| `HF_TOKEN` | always |",
        lambda fixed: "`HF_TOKEN`" not in fixed),
    "required-when differs": (
        lambda t: t.replace("| `PREBUILT_WHEEL_ARTIFACT_URI` | WHEEL_SOURCE=prebuilt-wheelhouse |",
                            "| `PREBUILT_WHEEL_ARTIFACT_URI` | WHEEL_SOURCE=wheel-builder |"),
        "build contract: PREBUILT_WHEEL_ARTIFACT_URI", "| `PREBUILT_WHEEL_ARTIFACT_URI` |",
        lambda fixed: "| `PREBUILT_WHEEL_ARTIFACT_URI` | WHEEL_SOURCE=prebuilt-wheelhouse |" in fixed),
    "optional row the script requires": (
        lambda t: t.replace("| `GHCR_TOKEN` | always |", "| `GHCR_TOKEN` | optional |"),
        "build contract: GHCR_TOKEN", "| `GHCR_TOKEN` |",
        lambda fixed: "| `GHCR_TOKEN` | always |" in fixed and "| `GHCR_TOKEN` | optional" not in fixed),
    "default differs": (
        lambda t: t.replace("optional (default: gpu-rl)", "optional (default: gpu-rl-image)"),
        "build contract: TAG_PREFIX", "| `TAG_PREFIX` |",
        lambda fixed: "optional (default: gpu-rl)" in fixed and "gpu-rl-image" not in fixed),
    "required variable without a row": (
        lambda t: t.replace("| `GITSHA` | always | the full 40-hex committed revision the bundle was cut from |\n",
                            ""),
        "build contract: GITSHA", "| `GHCR_IMAGE_REPOSITORY` |",  # rows are added after the table's last row
        lambda fixed: "| `GITSHA` | always |" in fixed),
    "placement for an architecture the script does not build": (
        lambda t: t.replace("| arm64 | cw-us-east-08a | interactive |",
                            "| arm64 | cw-us-east-08a | interactive |\n| riscv64 | cw-nowhere | batch |"),
        "placement: riscv64", "| riscv64 | cw-nowhere |",
        lambda fixed: "riscv64" not in fixed),
    "template passes an -e nothing reads": (
        lambda t: t.replace(AMD_WHEEL, '  -e STALE_KNOB "$STALE_KNOB" \\\n' + AMD_WHEEL, 1),
        "launch amd64: -e STALE_KNOB", '-e STALE_KNOB "$STALE_KNOB"',
        lambda fixed: "STALE_KNOB" not in fixed),
    "template lacks a required -e": (
        lambda t: t.replace('  -e GHCR_TOKEN "$GHCR_TOKEN" \\\n' + AMD_WHEEL, AMD_WHEEL, 1),
        "launch amd64: -e GHCR_TOKEN", "-e WHEEL_SOURCE wheel-builder",
        lambda fixed: fixed.count('-e GHCR_TOKEN "$GHCR_TOKEN" \\') == 2),
}


def _snapshot(fix, base: str = "c" * 40) -> SourceSnapshot:
    return SourceSnapshot(build_commit="d" * 40, base_commit=base, branch="b", pushed=False, created_commit=True,
                          harbor_commit="e" * 40, harbor_diff=None, changed_files=[OPS],
                          ops_doc_corrected=fix.text is not None,
                          ops_corrections=[c.describe(OPS) for c in fix.corrections], digests_in="pr_body",
                          pin_target_reason="no pin table",
                          bundle=BundleSummary(sha256="0" * 64, size_bytes=1, file_count=1))


def _pr_body(src: SourceSnapshot) -> str:
    from domain.config import ServiceConfig

    config = ServiceConfig.model_validate({
        "work_dir": "/nonexistent", "repos": {"marinskyrl_url": "file:///x", "harbor_url": "file:///y"},
        "clusters": {}, "registry": {"image_repository": "127.0.0.1:5000/gpu-rl",
                                     "user": {"kind": "literal_public", "value": "u"},
                                     "token": {"kind": "env", "name": "X"}},
        "github": {"token": {"kind": "env", "name": "X"}}})
    target = TargetResult(key="amd64-standard", architecture="amd64", variant="standard", status="validated",
                          cluster="c", job_ids=["/u/j"], tag="gpu-rl-x", image_ref="127.0.0.1:5000/gpu-rl:gpu-rl-x",
                          digest="sha256:" + "a" * 64)
    req = BuildRequest(architectures=["amd64"], variants=["standard"],
                       compatibility_request=CompatibilityRequest(requested_by="t", reason="t"))
    return RecordActivities(config)._pr_body(RecordInput(request_id="r", request=req, source=src, targets=[target]))


def _named_everywhere(fix, line: int) -> None:
    """The report (plan and build alike) and the PR body name the corrected line as file:line."""
    src = _snapshot(fix)
    report = report_markdown(PipelineReport(workflow_id="w", status="planned", request=BuildRequest(
        architectures=["amd64"], variants=["standard"],
        compatibility_request=CompatibilityRequest(requested_by="t", reason="t")), source=src))
    body = _pr_body(src)
    for text in (report, body):
        assert re.search(rf"{re.escape(OPS)}:{line}\b", text.replace("\\", "")), text


@pytest.mark.parametrize("kind", list(FIXTURE_KINDS))
def test_each_kind_of_stale_fact_is_corrected_and_named(kind):
    edit, field, needle, no_residual = FIXTURE_KINDS[kind]
    files = dict(fixture_files())
    files[OPS] = edit(files[OPS])
    c = contract(files)
    reported = {d.field: d for d in c.disagreements}
    assert field in reported, sorted(reported)
    fix = ops_fix(c)
    line = line_of(files[OPS], needle)
    assert line in {x.line for x in fix.corrections}, [x.describe(OPS) for x in fix.corrections]
    assert fix.text is not None and no_residual(fix.text)
    # Read again, the committed doc reports nothing the service corrects.
    again = contract({**files, OPS: fix.text})
    assert [d.field for d in again.disagreements if d.against == "script"] == []
    assert ops_fix(again).text is None
    _named_everywhere(fix, line)


def _real(tmp_path, era, edits=None):
    repo, sha = commit_tree(tmp_path, era, edits)
    return load_contract(files_at(repo, sha), sha)


def test_era_c_credential_nothing_reads_and_launcher_pin_sentence_are_corrected(tmp_path):
    c = _real(tmp_path, "era-c")
    fix = ops_fix(c, pin_table=None, protected=[LAUNCHER])
    by_line = {x.line: x for x in fix.corrections}
    b64 = line_in("era-c", OPS, "BUILD_B64=$(base64")
    pin = line_in("era-c", OPS, "digests are pinned in `cloud/iris/launch_rl_iris.py`")
    assert "nothing reads BUILD_B64" in by_line[b64].why and by_line[b64].after == ""
    assert "training launcher" in by_line[pin].why and "PR body and issue" in by_line[pin].after
    assert "BUILD_B64" not in fix.text
    assert not re.search(r"pinned in `cloud/iris/launch_rl_iris.py`", fix.text)
    # The renamed credentials (kind: a credential the script reads under another name).
    user = line_in("era-c", OPS, "| `DOCKER_USER_ID` | always |")
    assert "REGISTRY_USER" in by_line[user].after and "DOCKER_USER_ID" not in fix.text
    again = _real(tmp_path / "again", "era-c", {OPS: lambda _: fix.text})
    assert [d for d in again.disagreements if d.against == "script"] == []
    assert ops_fix(again, protected=[LAUNCHER]).text is None
    _named_everywhere(fix, b64)
    _named_everywhere(fix, pin)
    # With a pin table the sentence points at it instead.
    with_table = ops_fix(c, pin_table="cloud/iris/gpu_rl_images.py", protected=[LAUNCHER])
    assert "pinned in `cloud/iris/gpu_rl_images.py` by the build's PR" in with_table.text


def test_era_b_launcher_pin_paragraph_is_rewritten_whole(tmp_path):
    c = _real(tmp_path, "era-b")
    fix = ops_fix(c, protected=[LAUNCHER])
    first = line_in("era-b", OPS, "Deployed digests live in `cloud/iris/launch_rl_iris.py`")
    assert {x.line for x in fix.corrections} == {first, first + 1}
    assert "Single source of truth; do not copy a digest elsewhere" not in fix.text
    assert "- Deployed image digests are recorded with their validation evidence" in fix.text
    assert ops_fix(_real(tmp_path / "again", "era-b", {OPS: lambda _: fix.text}), protected=[LAUNCHER]).text is None


def test_stale_fact_that_cannot_be_rewritten_safely_refuses_naming_the_line():
    # The unread pair ends the arm64 command: removing it would leave the line before with a dangling `\`.
    arm = fixture_files()[OPS].split("### arm64", 1)
    arm[1] = re.sub(r"  -- bash -lc '[^\n]*'\n", '  -e STALE_KNOB "$STALE_KNOB"\n', arm[1], count=1)
    text = "### arm64".join(arm)
    files = {**fixture_files(), OPS: text}
    c = contract(files)
    with pytest.raises(UncorrectableProse, match=rf"{re.escape(OPS)}:{line_of(text, 'STALE_KNOB')}\b"):
        ops_fix(c)


def test_era_c_stale_tag_forms_are_corrected(tmp_path):
    swapped = _real(tmp_path, "era-c", {OPS: lambda t: t.replace("`gpu-rl-<sha>-arm64`", "`gpu-rl-arm64-<sha>`")})
    assert [d for d in swapped.disagreements if d.field == "tag forms: arm64"]
    fix = ops_fix(swapped, protected=[LAUNCHER])
    row = line_in("era-c", OPS, "| arm64 | `cw-us-east-08a`")
    (x,) = [x for x in fix.corrections if x.line == row]
    assert "`gpu-rl-<sha>-arm64`, `gpu-rl-megatron-<sha>-arm64`" in x.after and "derives the arm64 tags" in x.why
    again = _real(tmp_path / "again", "era-c", {OPS: lambda _: fix.text})
    assert not [d for d in again.disagreements if d.field.startswith("tag forms")]
    _named_everywhere(fix, row)
