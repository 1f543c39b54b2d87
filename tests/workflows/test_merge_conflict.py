"""A PR that cannot merge says why, and the service resolves what it owns (issue #34.6): two builds whose PRs
change the same pin-table lines, merged in both orders.

Real Temporal dev server, the worker's real record activities (the merge, and resolve_conflict on a real git
mirror of the stand-in's bare repo), and the GitHub stand-in computing ``mergeable`` with real git. Build
``old`` is built from S1 (main's commit B), build ``new`` from S2 (B plus one commit): each PR pins its own
digest for amd64/standard. Without the handling, the second PR's 405 went only to the worker log and the
report offered the same approve command again (the tests' waits then time out)."""

from __future__ import annotations

import asyncio
import uuid
from pathlib import Path

import pytest
from temporalio.client import WorkflowFailureError
from temporalio.common import SearchAttributePair, TypedSearchAttributes

from domain.buildset import BuildRequest, CompatibilityRequest
from domain.config import ServiceConfig
from domain.models import (
    BuildState,
    BundleSummary,
    MergeAuthorization,
    MergeWaitState,
    PipelineInput,
    PipelineReport,
    PullRequestInfo,
    SourceSnapshot,
    TargetResult,
)
from domain.pins import PinEntry, read_pins, update_pin_table
from runtime import operator_client as oc
from runtime import search_attributes as sa
from tests.fixtures_github import STANDIN_REPO
from tests.workflows.test_webhook_wake import _config, _until
from worker import build_worker
from workflows.pipeline import BuildPipelineWorkflow

HANG_GUARD_S = 120
PIN_TABLE = "cloud/iris/gpu_rl_images.py"
FIXTURE_TABLE = Path(__file__).resolve().parents[2] / "sandbox/fixtures/marinskyrl" / PIN_TABLE
KEY = ("AMD64", "STANDARD")


def _fast(tmp_path, temporal, gh) -> ServiceConfig:
    """Polling config (no webhook: GitHub sends none to a PR when main moves under it)."""
    raw = _config(tmp_path, temporal, gh).model_dump(mode="json")
    raw["github"].pop("webhook")
    raw["policy"].update(merge_watch_interval_s=0.3, merge_watch_authorized_interval_s=0.3)
    return ServiceConfig.model_validate(raw)


def _table(source: str, digest: str) -> str:
    return update_pin_table(FIXTURE_TABLE.read_text(), [PinEntry(
        architecture="amd64", variant="standard", digest=digest, tag=f"gpu-rl-{source}", source_commit=source,
        harbor_commit="2" * 40)])


def _commit(gh, start: str, files: dict[str, str], message: str, push: str) -> str:
    work = gh.work
    work.git.fetch("origin")
    work.git.checkout("-B", f"tmp-{uuid.uuid4().hex[:6]}", start)
    for name, text in files.items():
        path = Path(work.working_dir) / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
        work.git.add(name)
    work.git.commit("-m", message)
    work.git.push("origin", f"HEAD:refs/heads/{push}", "--force")
    return work.head.commit.hexsha


class Build:
    def __init__(self, handle, pr: PullRequestInfo, source: str, digest: str):
        self.handle, self.pr, self.source, self.digest = handle, pr, source, digest


async def _start(client, config, gh, *, name: str, base: str, digest: str) -> Build:
    """A build of source ``base`` (its build commit: no Harbor change) waiting on its PR, as record leaves it."""
    wid = f"{name}-{uuid.uuid4().hex[:8]}"
    branch = config.repos.build_branch(wid)
    pin = _commit(gh, base, {PIN_TABLE: _table(base, digest)},
                  f"Pin GPU-RL images built from {base[:12]}\n\nBuild-Request: {wid}-pins", branch)
    async with gh.client() as c:
        pull = await c.ensure_pull(branch, "main", f"pin {name}", "conflict test")
    gh.handle.set_check(STANDIN_REPO, pin, "ci", conclusion="success")
    pr = PullRequestInfo(number=pull.number, url=pull.html_url or "", head_sha=pin, pin_commit=pin)
    req = BuildRequest(architectures=["amd64"], variants=["standard"],
                       compatibility_request=CompatibilityRequest(requested_by="test", reason="conflicts"))
    target = TargetResult(key="amd64-standard", architecture="amd64", variant="standard", status="validated",
                          cluster="c", job_ids=["/j/1"], tag=f"gpu-rl-{base}", image_ref=f"registry.invalid/x:{base}",
                          digest=digest)
    state = BuildState(base_commit=base, default_branch="main", harbor_commit="2" * 40, harbor_pinned={},
                       architectures=["amd64"], policies=[], disagreements=[])
    source = SourceSnapshot(build_commit=base, base_commit=base, branch=branch, pushed=True, created_commit=False,
                            harbor_commit="2" * 40, harbor_diff=None, changed_files=[], ops_doc_corrected=False,
                            bundle=BundleSummary(sha256="f" * 64, size_bytes=1, file_count=1))
    rep = PipelineReport(workflow_id=wid, status="awaiting_merge", request=req, pull_request=pr, targets=[target],
                         state=state, source=source)
    handle = await client.start_workflow(
        BuildPipelineWorkflow.run, PipelineInput(request=req, request_id=wid, resume=MergeWaitState(report=rep)),
        id=wid, task_queue=config.temporal.task_queue,
        search_attributes=TypedSearchAttributes([SearchAttributePair(sa.STAGE, "awaiting_merge")]))
    return Build(handle, pr, base, digest)


async def _green(build: Build):
    rep = await build.handle.query(BuildPipelineWorkflow.report)
    return rep if rep.waiting and rep.waiting[0].kind == "merge_authorization" else None


async def _waiting(build: Build, kind: str):
    rep = await build.handle.query(BuildPipelineWorkflow.report)
    return rep if rep.waiting and rep.waiting[0].kind == kind else None


def _main_pins(gh) -> dict[str, str]:
    gh.work.git.fetch("origin")
    return read_pins(gh.work.git.show(f"origin/main:{PIN_TABLE}"))[KEY]


@pytest.fixture
def two_sources(github_standin):
    """main: B (the pin table as the fixture has it), then S2 (one more commit, outside the image)."""
    gh = github_standin
    b = _commit(gh, "origin/main", {PIN_TABLE: FIXTURE_TABLE.read_text()}, "add the pin table", "main")
    s2 = _commit(gh, b, {"NOTES.md": "a change outside the image\n"}, "notes", "main")
    return b, s2


async def _approve_and_merge(build: Build) -> PipelineReport:
    await _until(lambda: _green(build), f"{build.handle.id} green")
    await build.handle.execute_update(BuildPipelineWorkflow.approve_merge, MergeAuthorization(by="tester"))
    return await asyncio.wait_for(build.handle.result(), HANG_GUARD_S)


async def test_the_older_source_merging_second_is_superseded_and_never_overwrites_the_newer_pins(
        tmp_path, temporal_dev_server, temporal_client, github_standin, two_sources):
    s1, s2 = two_sources
    config = _fast(tmp_path, temporal_dev_server, github_standin)
    async with build_worker(temporal_client, config, graceful_shutdown_s=5):
        old = await _start(temporal_client, config, github_standin, name="old", base=s1, digest="sha256:" + "1" * 64)
        new = await _start(temporal_client, config, github_standin, name="new", base=s2, digest="sha256:" + "2" * 64)
        await _until(lambda: _green(old), "old green")  # both mergeable until one merges
        merged = await _approve_and_merge(new)
        assert merged.status == "merged"
        with pytest.raises(WorkflowFailureError):
            await asyncio.wait_for(old.handle.result(), HANG_GUARD_S)
        rep = await oc.read_report(temporal_client, old.handle.id)
        async with github_standin.client() as c:
            old_pull = await c.get_pull(old.pr.number)
            comments = [x.body for x in await c.list_issue_comments(old.pr.number)]

    f = rep.failure
    assert rep.status == "cancelled" and (f.failure_class, f.error_type) == ("superseded", "Superseded")
    assert f.message.startswith(f"superseded by {new.handle.id}: PR #{old.pr.number} conflicts with main")
    assert f"already pins images built from {s2[:12]}, the same or a newer source than this build's {s1[:12]}" \
        in f.message
    assert not old_pull.merged and _main_pins(github_standin)["digest"] == new.digest  # the newer pins stay
    assert old_pull.state == "closed" and any(b.startswith("Superseded: main (") for b in comments)


async def test_the_newer_source_merging_second_rebases_its_pin_commit_and_merges_after_a_new_approval(
        tmp_path, temporal_dev_server, temporal_client, github_standin, two_sources):
    s1, s2 = two_sources
    config = _fast(tmp_path, temporal_dev_server, github_standin)
    async with build_worker(temporal_client, config, graceful_shutdown_s=5):
        old = await _start(temporal_client, config, github_standin, name="old", base=s1, digest="sha256:" + "1" * 64)
        new = await _start(temporal_client, config, github_standin, name="new", base=s2, digest="sha256:" + "2" * 64)
        await _until(lambda: _green(new), "new green")
        github_standin.handle.set_check(STANDIN_REPO, new.pr.pin_commit, "ci", status="in_progress", conclusion=None)
        await _until(lambda: _waiting(new, "merge_checks"), "new's checks running again")
        ack = await new.handle.execute_update(BuildPipelineWorkflow.approve_merge, MergeAuthorization(by="tester"))
        assert "accepted and queued" in ack  # approved for the tree it saw; the older build merges first
        assert (await _approve_and_merge(old)).status == "merged"
        github_standin.handle.set_check(STANDIN_REPO, new.pr.pin_commit, "ci", conclusion="success")

        async def rebased():
            rep = await new.handle.query(BuildPipelineWorkflow.report)
            pr = rep.pull_request
            return rep if pr.pin_commit != new.pr.pin_commit and rep.review and rep.review.head_sha == pr.pin_commit \
                else None
        rep = await _until(rebased, "the pin commit written again on the new main", attempts=1200)
        pin = rep.pull_request.pin_commit
        assert github_standin.branch_sha(rep.source.branch) == pin
        assert rep.merge_authorization is None  # given for the old tree: a new approval is asked for
        assert "written again on it" in rep.message
        async with github_standin.client() as c:
            assert not (await c.get_pull(new.pr.number)).merged  # not merged on the old approval
        github_standin.handle.set_check(STANDIN_REPO, pin, "ci", conclusion="success")
        final = await _approve_and_merge(new)

    assert final.status == "merged" and _main_pins(github_standin) == {
        "digest": new.digest, "tag": f"gpu-rl-{s2}", "source_commit": s2, "harbor_commit": "2" * 40}


async def test_a_conflict_with_changes_that_reach_the_image_waits_saying_why_and_offers_the_rebuild(
        tmp_path, temporal_dev_server, temporal_client, github_standin, two_sources):
    """Someone changed the pin lines and a Dockerfile on main by hand: GitHub cannot merge the PR, main pins
    nothing newer of this source, and the new commits cross the rebuild boundary (``docker/**``): the build
    waits (kind merge_conflict) saying the validated images no longer match main, with the rebuild command,
    in the report, the UI and ``starter.py report``; nothing is pushed or merged."""
    from domain.report import report_markdown
    from tests.workflows.test_terminal_outcomes import details
    _, s2 = two_sources
    config = _fast(tmp_path, temporal_dev_server, github_standin)
    async with build_worker(temporal_client, config, graceful_shutdown_s=5):
        new = await _start(temporal_client, config, github_standin, name="new", base=s2, digest="sha256:" + "2" * 64)
        await _until(lambda: _green(new), "green")
        _commit(github_standin, s2, {PIN_TABLE: _table("9" * 40, "sha256:" + "9" * 64),
                                     "docker/Dockerfile.gpu-rl": "FROM scratch\n"}, "by hand on main", "main")
        rep = await _until(lambda: _waiting(new, "merge_conflict"), "the conflict shown")
        shown = await details(new.handle)
        ack = await new.handle.execute_update(BuildPipelineWorkflow.approve_merge, MergeAuthorization(by="tester"))
        async with github_standin.client() as c:
            pull = await c.get_pull(new.pr.number)
        await new.handle.cancel()

    w = rep.waiting[0]
    assert f"PR #{new.pr.number}" in w.detail and "cannot merge" in w.detail
    assert "the validated images no longer match main" in w.detail and "docker/Dockerfile.gpu-rl" in w.detail
    assert w.command and w.command.startswith("python starter.py build") and "python starter.py cancel" in w.detail
    assert "the validated images no longer match main" in shown and "the validated images no longer match main" \
        in report_markdown(rep)
    assert "accepted, held" in ack and "cannot merge" in ack
    assert not pull.merged and pull.head_sha == new.pr.pin_commit  # nothing pushed, nothing merged
