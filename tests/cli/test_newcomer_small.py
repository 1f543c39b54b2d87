"""Issue 38, smaller things: exit codes agree across commands, the terminal report carries no HTML entities,
``scripts/sandbox-build`` says where it left its state and offers ``--clean``."""

from __future__ import annotations

import asyncio

import pytest
from temporalio.client import WorkflowUpdateFailedError
from temporalio.exceptions import ApplicationError

import starter
from domain.models import BundleSummary, HarborDiffSummary, SourceSnapshot
from runtime.exit_codes import EXIT_FAILED, EXIT_USAGE
from tests.contract.test_report_provenance import _report


class _RefusingHandle:
    def __init__(self, cause: BaseException) -> None:
        self.id, self._cause = "wf", cause

    async def execute_update(self, update, arg):
        raise WorkflowUpdateFailedError(self._cause)


@pytest.mark.parametrize("cause,code", [
    # decide on a target that is not waiting (workflows/target.py validator): 2, like recheck's refusal
    (ApplicationError("amd64-standard is not waiting for an operator decision", type="ValueError"), EXIT_USAGE),
    (ApplicationError("--by mallory is not a configured operator", type="NotAuthorized"), EXIT_USAGE),
    (ApplicationError("GitHub answered 500", type="GitHubError"), EXIT_FAILED),
])
def test_a_refused_operator_update_exits_like_every_other_refusal(cause, code, capsys):
    with pytest.raises(SystemExit) as done:
        asyncio.run(starter._send_update(_RefusingHandle(cause), None, None))
    assert done.value.code == code
    assert capsys.readouterr().err.startswith(f"error: refused: {cause.message}")


def test_the_terminal_report_has_no_html_entities_or_markdown_escapes(capsys):
    """GitHub's escaping (``-&gt;``, zero-width spaces, backslashes) is for the PR body, not the terminal."""
    rep = _report(status="merged")
    rep.source = SourceSnapshot(
        build_commit="c" * 40, base_commit="b" * 40, branch="gpu-rl-build/wf", pushed=True, created_commit=True,
        harbor_commit="h" * 40, changed_files=[], ops_doc_corrected=False,
        bundle=BundleSummary(sha256="f" * 64, size_bytes=1024, file_count=3),
        harbor_diff=HarborDiffSummary(old="a" * 40, new="d" * 40, affects_image=True,
                                      lines=["vllm ==0.27.2 -> ==0.28.1 <pinned>", "see marin#7920 (@alice)"]))
    starter._print_report(rep, as_json=False)
    out = capsys.readouterr().out
    assert "  - vllm ==0.27.2 -> ==0.28.1 <pinned>" in out and "  - see marin#7920 (@alice)" in out
    assert "&gt;" not in out and "&lt;" not in out and "\u200b" not in out
    from domain.report import report_markdown

    assert "-&gt; ==0.28.1" in report_markdown(rep)  # the Markdown for GitHub stays inert


def test_sandbox_build_says_where_it_left_its_state_and_offers_clean(tmp_path):
    from sandbox.demo import state_note

    state = tmp_path / "gpu-rl-sandbox-x"
    (state / "temporal").mkdir(parents=True)
    (state / "temporal" / "db.sqlite").write_bytes(b"\0" * 3_000_000)
    note = state_note(state, clean=False)
    assert f"sandbox state left in {state} (3 MB" in note and f"rm -rf {state}" in note and "--clean" in note
    assert state.exists()
    assert state_note(state, clean=True) == f"sandbox state {state} removed (--clean)"
    assert not state.exists()


def test_sandbox_build_offers_clean_in_its_help():
    from click.testing import CliRunner

    from sandbox.demo import main

    assert "--clean" in CliRunner().invoke(main, ["--help"]).output


def test_logs_print_the_iris_key_once_not_on_every_line(tmp_path):
    """Issue 38.5: each stored line carried ``[/gpu-rl-builder/gpurl-kaniko-…/0:0 stdout] `` (about 70
    characters); `logs` prints it once, when it changes, and the lines without it."""
    import hashlib

    from domain.models import FileRef
    from runtime.evidence import EvidenceItem, render_failed_step

    key = "/gpu-rl-builder/gpurl-kaniko-amd64-standard-0a1b2c3d4e5f-r2/0:0"
    lines = [f"[{key} stdout] step {i}" for i in range(5)] + [f"[{key} stderr] error: datasets import failed",
                                                               f"[{key} stdout] exit status 3"]
    data = ("\n".join(lines) + "\n").encode()
    path = tmp_path / "failure.log"
    path.write_bytes(data)
    ref = FileRef(uri=path.as_uri(), sha256=hashlib.sha256(data).hexdigest(), size_bytes=len(data))
    item = EvidenceItem(target="amd64-standard", kind="failure log", job_id=key.rsplit("/", 1)[0], ref=ref,
                        failure_class="assertion_failure")
    for full in (False, True):
        out = render_failed_step(item, full=full)
        assert sum(key in line for line in out) == 1, out  # the one -- line under the == header
        assert out[1] == f"-- {key}", out
        assert not any(line.lstrip(">").strip().split("|")[-1].strip().startswith("[/") for line in out), out
    marked = [line for line in render_failed_step(item) if line.startswith(">")]
    assert marked == [">     6 | [stderr] error: datasets import failed"]


def test_an_unknown_by_names_the_configured_operators(tmp_path, capsys):
    from domain.config import load_config
    from tests.domain.test_config import GOOD

    p = tmp_path / "c.toml"
    p.write_text(GOOD + '[operators]\nlogins = ["ana", "sandbox-operator"]\n')
    with pytest.raises(SystemExit) as done:
        starter._operator(load_config(p), "mallory")
    assert done.value.code == EXIT_USAGE
    assert "--by mallory: not a configured operator (operators.logins: ana, sandbox-operator)" in capsys.readouterr().err


def test_a_refusal_for_an_unconfigured_planned_cluster_offers_a_build_command_with_cluster():
    """Issue 38.4: in the sandbox the ops doc's clusters are not configured; the refusal's next step must be
    a command that runs as printed, so it carries the --cluster flag the refusal names."""
    import shlex

    from activities.source import cluster_suggestion
    from domain.buildset import BuildRequest, CompatibilityRequest
    from domain.outcome import input_failure

    configured = {"sandbox-amd64": "amd64", "sandbox-arm64": "arm64"}
    message = ("planned cluster(s) amd64→cw-rno2a (from docs/ops.md placements) are not configured (clusters: "
               "sandbox-amd64, sandbox-arm64); add them to the configuration or pass --cluster ARCH=CLUSTER"
               + cluster_suggestion(["amd64"], configured))
    assert message.endswith("(pass: --cluster amd64=sandbox-amd64)")
    request = BuildRequest(architectures=["amd64"], variants=["megatron"],
                           compatibility_request=CompatibilityRequest(requested_by="sandbox-operator", reason="first"))
    step = input_failure("InputError", message, request).next_step
    command = step.split("`")[-2]
    assert shlex.split(command)[:3] == ["python", "starter.py", "build"]
    assert "--cluster amd64=sandbox-amd64" in command, step
    assert cluster_suggestion(["amd64"], {"a": "amd64", "b": "amd64"}) == ""  # two candidates: no guess
