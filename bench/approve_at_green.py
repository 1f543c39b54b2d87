"""Benchmark: approve-at-green latency of the merge gate (issue #22.4).

Starts the sandbox stack (Temporal dev server, GitHub stand-in over real git remotes, ...) and an
in-process worker with the real activities, then for each trial opens a fresh PR and starts a pipeline
directly in its merge wait (``PipelineInput.resume``: what a continued run carries), and measures two
operator paths, wall clock in this process:

- *approve at green*: CI turns green and the operator approves at that same moment (before the PR watch
  has seen it): green → merged. Before the merge gate the approval was refused until the watch's 5 s poll
  had seen green (issue #22: 10–14 refusals over 5.2–5.6 s).
- *approve while pending*: the operator approves while CI runs (accepted at once: ack time), CI turns green
  later without a second command: green → merged (the watch polls at
  ``policy.merge_watch_authorized_interval_s`` while an authorization waits).

``--webhook``: the same trials with the worker's GitHub webhook receiver on (``[github.webhook]``) and the
stand-in delivering signed webhooks to it: a check turning green wakes the watch at once instead of at its
next poll (the poll intervals are the defaults in both modes: the webhook races the poll). The table then
also says how many merges followed a webhook wake (a ``github_changed`` signal before the merge step).

Prints a Markdown table; asserts nothing.
Run: .venv/bin/python bench/approve_at_green.py [--n 5] [--webhook]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import secrets
import socket
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import git  # noqa: E402
from temporalio.client import Client  # noqa: E402
from temporalio.common import SearchAttributePair, TypedSearchAttributes  # noqa: E402
from temporalio.contrib.pydantic import pydantic_data_converter  # noqa: E402

from bench._stack import add_stack_flag, bench_stack  # noqa: E402
from clients.github import GitHubClient  # noqa: E402
from domain.buildset import BuildRequest, CompatibilityRequest  # noqa: E402
from domain.config import GitHubWebhookSettings, load_config  # noqa: E402
from domain.models import (  # noqa: E402
    MergeAuthorization,
    MergeWaitState,
    PipelineInput,
    PipelineReport,
    PullRequestInfo,
)
from runtime import search_attributes as sa  # noqa: E402
from sandbox.git_remotes import commit_to_remote  # noqa: E402
from sandbox.stack import MARINSKYRL_SLUG  # noqa: E402
from worker import _webhooks, build_worker  # noqa: E402
from workflows.pipeline import BuildPipelineWorkflow  # noqa: E402


async def _open_pr(stack, gh: GitHubClient, name: str, branch: str) -> PullRequestInfo:
    repo = git.Repo(stack.remotes.marinskyrl_url.removeprefix("file://"))
    repo.git.branch(branch, "main")  # a branch of its own off main, then one commit on it
    sha = commit_to_remote(stack.remotes.marinskyrl_url, {f"bench/{name}.txt": name + "\n"}, f"bench {name}",
                           branch=branch)
    pull = await gh.ensure_pull(branch, "main", f"bench {name}", "approve-at-green benchmark")
    return PullRequestInfo(number=pull.number, url=pull.html_url or "", head_sha=sha)


async def _start(client: Client, queue: str, wid: str, pr: PullRequestInfo):
    req = BuildRequest(architectures=["amd64"], variants=["standard"],
                       compatibility_request=CompatibilityRequest(requested_by="bench", reason="approve-at-green"))
    rep = PipelineReport(workflow_id=wid, status="awaiting_merge", request=req, pull_request=pr)
    inp = PipelineInput(request=req, request_id=wid, resume=MergeWaitState(report=rep))
    # BuildStage as a continued merge wait inherits it (the webhook receiver lists the builds by it).
    return await client.start_workflow(BuildPipelineWorkflow.run, inp, id=wid, task_queue=queue,
                                       search_attributes=TypedSearchAttributes([
                                           SearchAttributePair(sa.STAGE, "awaiting_merge")]))


async def _seen(handle, pred, limit_s: float = 60.0):
    deadline = time.monotonic() + limit_s
    while time.monotonic() < deadline:
        rep = await handle.query(BuildPipelineWorkflow.report)
        if rep.review and pred(rep.review):
            return rep
        await asyncio.sleep(0.05)
    raise TimeoutError("the PR watch did not report the expected state")


async def _merge_step(handle) -> tuple[float, float, bool]:
    """(scheduled, closed) epoch seconds of the merge activity, from history (the server's clock), and
    whether a webhook (``github_changed`` signal) woke the watch before the merge was scheduled."""
    scheduled = closed = 0.0
    sched_id = None
    woken = False
    async for e in handle.fetch_history_events():
        if e.HasField("workflow_execution_signaled_event_attributes") and sched_id is None and \
                e.workflow_execution_signaled_event_attributes.signal_name == "github_changed":
            woken = True
        if e.HasField("activity_task_scheduled_event_attributes") and \
                e.activity_task_scheduled_event_attributes.activity_type.name == "merge_pull_request":
            scheduled, sched_id = e.event_time.ToMicroseconds() / 1e6, e.event_id
        if e.HasField("activity_task_completed_event_attributes") and \
                e.activity_task_completed_event_attributes.scheduled_event_id == sched_id:
            closed = e.event_time.ToMicroseconds() / 1e6
    return scheduled, closed, woken


async def _trial(stack, config, client, gh, queue: str, mode: str, i: int) -> tuple[float, float, float, float, bool]:
    name = f"{mode.split(',')[0].replace(' ', '-')}-{i}-{uuid.uuid4().hex[:6]}"
    wid = f"bench-approve-{name}"
    # The PR on the build's own branch, as the record step opens it (how a webhook finds the build).
    pr = await _open_pr(stack, gh, name, config.repos.build_branch(wid))
    handle = await _start(client, queue, wid, pr)
    await _seen(handle, lambda r: r.checks == "pending")  # CI running: the watch long-polls
    auth = MergeAuthorization(by="bench-operator")
    if mode == "approve at green":
        t0, wall0 = time.monotonic(), time.time()
        stack.github.set_check(MARINSKYRL_SLUG, pr.head_sha, "ci")
        ack_start = time.monotonic()
        await handle.execute_update(BuildPipelineWorkflow.approve_merge, auth)
        ack = time.monotonic() - ack_start
    else:
        ack_start = time.monotonic()
        await handle.execute_update(BuildPipelineWorkflow.approve_merge, auth)
        ack = time.monotonic() - ack_start
        await asyncio.sleep(1.0)  # CI finishes a while after the approval
        t0, wall0 = time.monotonic(), time.time()
        stack.github.set_check(MARINSKYRL_SLUG, pr.head_sha, "ci")
    rep: PipelineReport = await handle.result()
    done = time.monotonic() - t0
    assert rep.status == "merged", rep.message
    scheduled, closed, woken = await _merge_step(handle)
    return done, ack, scheduled - wall0, closed - scheduled, woken


def _row(label: str, xs: list[float]) -> str:
    xs = sorted(xs)
    p95 = xs[min(len(xs) - 1, round(0.95 * (len(xs) - 1)))]
    return f"| {label} | {len(xs)} | {statistics.median(xs):.2f} | {p95:.2f} | {max(xs):.2f} |"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _with_webhook(config, state_dir: Path):
    """The sandbox configuration plus ``[github.webhook]`` on a free local port, its secret in a 0600 file."""
    secret_file = state_dir / "secrets" / "github-webhook-secret"
    secret_file.parent.mkdir(parents=True, exist_ok=True)
    secret_file.write_text(secrets.token_hex(20))
    secret_file.chmod(0o600)
    hook = GitHubWebhookSettings(listen=f"127.0.0.1:{_free_port()}",
                                 secret={"kind": "file", "path": str(secret_file)})
    return config.model_copy(update={"github": config.github.model_copy(update={"webhook": hook})}), \
        secret_file.read_text()


async def main(n: int, webhook: bool, shared: Path | None = None) -> None:
    with tempfile.TemporaryDirectory(prefix="bench-approve-") as tmp, bench_stack(shared, Path(tmp), "approve") as stack:
        config = load_config(stack.config_path)
        secret = None
        if webhook:
            config, secret = _with_webhook(config, Path(tmp))
        client = await Client.connect(stack.temporal.address, namespace=stack.temporal.namespace,
                                      data_converter=pydantic_data_converter)
        policy = config.policy
        async with build_worker(client, config, graceful_shutdown_s=5), \
                (_webhooks(client, config) if webhook else contextlib.nullcontext()) as receiver, \
                GitHubClient(stack.github.api_url, stack.github.token, MARINSKYRL_SLUG) as gh:
            if receiver is not None:
                stack.github.set_webhook(f"http://127.0.0.1:{receiver.port}{config.github.webhook.path}", secret)
            results: dict[str, list[tuple]] = {}
            for mode in ("approve at green", "approve while pending, then green"):
                results[mode] = [await _trial(stack, config, client, gh, config.temporal.task_queue, mode, i)
                                 for i in range(n)]
        via = " (webhooks on)" if webhook else ""
        print(f"poll intervals: merge_watch_interval_s={policy.merge_watch_interval_s}, "
              f"merge_watch_authorized_interval_s={policy.merge_watch_authorized_interval_s}; "
              f"webhooks: {'on' if webhook else 'off'}\n")
        print("| path | trials | p50 s | p95 s | max s |")
        print("|---|---|---|---|---|")
        for mode, rs in results.items():
            print(_row(f"{mode}{via}: green → merged", [r[0] for r in rs]))
        for mode, rs in results.items():
            print(_row(f"{mode}{via}: green → merge step scheduled (the gate's own latency)", [r[2] for r in rs]))
        for mode, rs in results.items():
            print(_row(f"{mode}{via}: merge step (GitHub stand-in: clone, merge, push)", [r[3] for r in rs]))
        for mode, rs in results.items():
            print(_row(f"{mode}{via}: approve-merge acknowledged", [r[1] for r in rs]))
        if webhook:
            for mode, rs in results.items():
                print(f"| {mode}: merges that followed a webhook wake | {sum(r[4] for r in rs)} of {len(rs)} | | | |")
        print("| before the merge gate (issue #22): approval refused after green for | 9 builds | 5.2–5.6 "
              "(10–14 refusals) | | |")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=5)
    parser.add_argument("--webhook", action="store_true",
                        help="run with the GitHub webhook receiver on (the stand-in delivers webhooks)")
    add_stack_flag(parser)
    parser.add_argument("--smoke", action="store_true", help="the smallest run that still prints every table, in seconds (tests/bench/test_bench_smoke.py)")
    args = parser.parse_args()
    asyncio.run(main(1 if args.smoke else args.n, args.webhook, args.stack))
