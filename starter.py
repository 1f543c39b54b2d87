"""gpu-rl-builder's operator CLI: start builds, follow them, decide, approve merges, manage schedules.

Every command talks to Temporal only; nothing depends on this terminal staying open. Exit codes:
0 success, 1 the build (or command target) failed, 2 bad input/usage, 3 cannot reach a service.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import shutil
import sys
import time
from datetime import timedelta
from typing import TYPE_CHECKING

import click

from domain.config import ConfigError, ServiceConfig, load_config
from domain.issue_ref import check_issue_host
from domain.operator_input import (
    MAX_NAME,
    OperatorInputError,
    build_request,
    check_against_config,
    clean_text,
    operator_name,
    request_differences,
)
from domain.terminal_text import plain_line, printable, printable_json
from runtime.exit_codes import EXIT_FAILED, EXIT_OK, EXIT_UNREACHABLE, EXIT_USAGE, CommandError
from runtime.temporal import connection_options, flags_from, resolve_config
from runtime.version import version

if TYPE_CHECKING:
    from temporalio.client import Client
    from temporalio.common import TypedSearchAttributes

    from domain.models import PipelineReport
    from domain.request import BuildRequest
    from runtime.search_attributes import BuildKind

# The Temporal SDK, the workflows and the pydantic models of other commands are imported inside the
# functions that use them: a refused request (bad flags, an --arch no configured cluster runs) exits
# before any of them is needed, in about the time the interpreter takes to start (bench/refusal.py).

# A schedule id also names the rebuild-check workflows it starts: no spaces or other separators.
SCHEDULE_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,99}")


def ls_remote_head(url: str, ref: str | None = None) -> str:
    """The commit a remote's default branch (or ``ref``) points at, read without cloning."""
    import git

    from clients.git_source import redact_url

    if ref and len(ref) == 40 and all(c in "0123456789abcdef" for c in ref):
        return ref
    out = git.cmd.Git().ls_remote(url, ref or "HEAD")
    for line in out.splitlines():
        sha, _, name = line.partition("\t")
        if ref is None or name in (f"refs/heads/{ref}", f"refs/tags/{ref}", f"refs/tags/{ref}^{{}}"):
            return sha
    shown = redact_url(url)
    raise OperatorInputError(f"--harbor-ref {ref}: no such branch, tag or commit in {shown}" if ref
                             else f"{shown}: no HEAD (empty repository?)")


def _fail(msg: str, code: int = EXIT_USAGE) -> None:
    click.echo(f"error: {msg}", err=True)
    sys.exit(code)


def _config(ctx: click.Context, request: BuildRequest | None = None, *, plan: bool | None = None) -> ServiceConfig:
    """The service configuration with its Temporal connection resolved. With ``request``: first refuse
    what the configuration alone decides (``check_against_config``), before anything else is read."""
    try:
        config = load_config(ctx.obj["config_path"])
        if request is not None:
            _check_against_config(config, request, plan)
        return resolve_config(config, ctx.obj.get("temporal_flags"))
    except ConfigError as e:
        _fail(str(e))
    raise AssertionError  # unreachable


def _check_against_config(config: ServiceConfig, request: BuildRequest, plan: bool | None) -> None:
    """A refusal the configuration decides, in the words the worker's plan would use: for ``build``
    (``plan`` True/False) with the same "next step" as a planned refusal, for a schedule the line alone."""
    try:
        check_against_config(request, {name: c.architecture for name, c in config.clusters.items()})
    except OperatorInputError as e:
        if plan is None:
            _fail(str(e))
        from domain.outcome import input_failure

        f = input_failure("InputError", str(e), request, plan=plan)
        _fail(printable(f"{f.message} — next step: {f.next_step}"))


def _quiet_sdk_core() -> None:
    """The SDK core (Rust) logs to this process's stderr by default: WARN lines with colour codes about
    retried calls. The operator's terminal shows what this CLI says about them ("reconnecting…"), never
    those; this process runs no worker, so nothing else is lost."""
    from temporalio.runtime import Runtime, TelemetryConfig

    Runtime.set_default(Runtime(telemetry=TelemetryConfig(logging=None)), error_if_already_set=False)


async def _client(config: ServiceConfig) -> Client:
    from clients.credentials import CredentialError
    from runtime.temporal import connect

    _quiet_sdk_core()
    try:
        return await connect(config)
    except (ConfigError, CredentialError) as e:  # e.g. an unset API-key variable: bad input, not unreachable
        _fail(f"Temporal connection settings: {e}", EXIT_USAGE)
    except RuntimeError as e:
        _fail(f"cannot reach Temporal at {config.temporal.address}: {e}", EXIT_UNREACHABLE)
    raise AssertionError


def _run(coro):
    return asyncio.run(coro)


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--config", "config_path", envvar="GPU_RL_BUILDER_CONFIG",
              help="Service configuration TOML (default: $GPU_RL_BUILDER_CONFIG). A Temporal profile, "
                   "TEMPORAL_* variables and the flags below override its [temporal] section.")
@connection_options
@click.version_option(version(), "--version", prog_name="gpu-rl-builder", message="%(prog)s %(version)s")
@click.pass_context
def cli(ctx: click.Context, config_path: str | None, **connection) -> None:
    """Build MarinSkyRL GPU-RL images on Iris, durably, through Temporal."""
    ctx.ensure_object(dict)
    ctx.obj["config_path"] = config_path
    ctx.obj["temporal_flags"] = flags_from(connection)


# --------------------------------------------------------------------------------------- build
@cli.command()
@click.option("--arch", "architectures", multiple=True, required=True,
              help="Architecture to build (repeatable), e.g. amd64, arm64.")
@click.option("--variant", "variants", multiple=True, default=("standard", "megatron"), show_default=True,
              help="Variant to build (repeatable).")
@click.option("--requested-by", help="Who explicitly requested a compatibility image (required).")
@click.option("--reason", help="Why a compatibility image is needed, e.g. an issue link (required).")
@click.option("--link", help="Link to the request (issue/PR URL).")
@click.option("--cluster", "clusters", multiple=True, metavar="ARCH=CLUSTER", help="Cluster override per architecture.")
@click.option("--priority", type=click.Choice(["production", "interactive", "batch"]), help="Iris priority band.")
@click.option("--harbor-ref", help="Harbor branch, tag or commit to bake (default: Harbor's default branch head).")
@click.option("--push-floating", is_flag=True, help="Also move the floating tag (only when explicitly asked).")
@click.option("--issue-url", help="Issue on which to post the build evidence.")
@click.option("--accept-unrehearsed", is_flag=True,
              help="Plan although a step of the build script could not be rehearsed (policy.rehearsal = "
                   "\"required\" refuses otherwise); the plan and report record it per target.")
@click.option("--allow-suspicious-files", is_flag=True,
              help="Bundle files the bundle's suspicious-file rule refuses (wheels, archives, binaries, files over "
                   "5 MiB) after you reviewed them; git-lfs pointer files are refused regardless.")
@click.option("--plan", "plan_only", is_flag=True, help="Resolve everything, submit nothing, print the plan.")
@click.option("--follow", "follow_", is_flag=True, help="Follow progress until the pipeline ends.")
@click.option("--json", "as_json", is_flag=True, help="Print the plan/report as JSON.")
@click.pass_context
def build(ctx, architectures, variants, requested_by, reason, link, clusters, priority, harbor_ref,
          push_floating, issue_url, accept_unrehearsed, allow_suspicious_files, plan_only, follow_, as_json):
    """Start (or attach to) the build pipeline for the latest MarinSkyRL + Harbor commits.

    Returns once the request is planned (every check done before any job is submitted): exit 2 when
    the request or the build contract is refused, 0 when the build runs; --follow waits for the end."""
    try:
        request = build_request(
            architectures=architectures, variants=variants, requested_by=requested_by, reason=reason, link=link,
            clusters=clusters, priority=priority, harbor_ref=harbor_ref, push_floating=push_floating,
            issue_url=issue_url, accept_unrehearsed=accept_unrehearsed,
            allow_suspicious_files=allow_suspicious_files)
    except OperatorInputError as e:
        _fail(str(e))
    config = _config(ctx, request, plan=plan_only)
    try:
        gh = config.github
        check_issue_host(request.issue_url, gh.api_url if gh else "https://api.github.com", gh and gh.web_url)
    except ValueError as e:
        _fail(str(e))
    _run(_build(config, request, plan_only, follow_, as_json))


def _heads(config: ServiceConfig, request) -> tuple[str, str]:
    from clients.git_source import redact_url
    from domain.redact import redact

    try:
        return ls_remote_head(config.repos.marinskyrl_url), ls_remote_head(config.repos.harbor_url, request.harbor_ref)
    except OperatorInputError as e:
        _fail(str(e))
    except Exception as e:  # noqa: BLE001 - git could not reach a remote
        # git's stderr may quote a remote URL with its password: credentials stripped, then redacted.
        last = redact(redact_url(str(e).strip().splitlines()[-1] if str(e).strip() else type(e).__name__))
        _fail(f"cannot read the default branches: {last[:300]}", EXIT_UNREACHABLE)
    raise AssertionError


async def _build(config, request, plan_only, follow_, as_json):
    from temporalio.exceptions import WorkflowAlreadyStartedError
    from temporalio.service import RPCError

    from domain.models import pipeline_id
    from runtime import operator_client as oc
    from runtime.temporal import workflow_ui_url

    src, harbor = _heads(config, request)
    wid = pipeline_id(src, harbor) + ("-plan" if plan_only else "")
    client = await _client(config)
    running = await _is_running(client, wid)
    if running:
        # Attach only to the same request: another architecture set (or cluster, priority, ...) for the
        # same commits would otherwise be silently dropped.
        differences = request_differences((await oc.started_input(client, wid)).request, request)
        if differences:
            _fail(f"{wid} is already running for these commits with a different request ({'; '.join(differences)}); "
                  f"wait for it (`python starter.py follow {wid}`) or cancel it, then build again")
    if not running and not await oc.has_workers(client, config.temporal.task_queue):
        # Nothing can check the request (the build contract is read by a worker): refuse before starting
        # anything rather than queue a request that may be invalid and report success.
        _fail(f"no worker polls task queue {config.temporal.task_queue}: the request cannot be checked and "
              "nothing was started; start a worker (`python worker.py`, same configuration) and build again",
              EXIT_UNREACHABLE)
    try:
        handle = await _start(client, config, request, plan_only, src, harbor, wid)
    except WorkflowAlreadyStartedError:
        _out(f"workflow: {wid} already completed for source {src[:12]} + harbor {harbor[:12]}; "
             "not starting a duplicate. Its report:", as_json)
        sys.exit(await _print_result(client, wid, as_json))
    except RPCError as e:
        raise oc.service_error(e, f"start {wid}") from None
    _out(f"workflow: {handle.id}{' (attached to the running pipeline)' if running else ''}", as_json)
    url = workflow_ui_url(config, wid)
    if url:
        _out(f"ui: {url}", as_json)
    if plan_only or follow_:
        if follow_ and not plan_only:
            await _follow(client, wid, config.temporal.task_queue, interval=10.0, as_json=as_json)
            if not as_json:
                sys.exit(await _print_summary(client, wid))
        code = await _print_result(client, wid, as_json)
        sys.exit(code)
    sys.exit(await _until_planned(client, config, wid, as_json))


def _echo_json(doc) -> None:
    """Machine output (``--json``, ``--format json``): through the terminal's redactor like every other
    line (domain/terminal_text.printable_json), still one valid JSON document."""
    click.echo(printable_json(doc if isinstance(doc, str) else json.dumps(doc, indent=2)))


def _out(line: str, as_json: bool) -> None:
    """Progress and notes: on stdout, except under --json where stdout carries JSON only."""
    click.echo(line, err=as_json)


async def _until_planned(client: Client, config: ServiceConfig, wid: str, as_json: bool,
                         timeout_s: float = 600.0) -> int:
    """Wait until the pipeline has passed planning, so a refused request exits 2 (not 0) without --follow."""
    try:
        return await _wait_for_plan(client, config, wid, as_json, timeout_s)
    except asyncio.CancelledError:  # Ctrl-C: the pipeline is started and plans on without this terminal
        _out(f"stopped waiting for the plan of {wid}; the build goes on without this terminal — "
             f"`python starter.py follow {wid}` follows it", as_json)
        raise


async def _wait_for_plan(client: Client, config: ServiceConfig, wid: str, as_json: bool, timeout_s: float) -> int:
    """``_until_planned`` without its Ctrl-C line."""
    from temporalio.client import WorkflowExecutionStatus

    from domain.models import Stage
    from runtime import operator_client as oc
    from runtime import search_attributes as sa

    planning = {None, Stage.QUEUED.value, Stage.LOADING.value, Stage.PREPARING_SOURCE.value, Stage.PLANNING.value}
    if not await oc.has_workers(client, config.temporal.task_queue):
        click.echo(f"error: no worker polls task queue {config.temporal.task_queue}: {wid} is queued and not "
                   f"checked yet; start a worker, then `python starter.py follow {wid}`", err=True)
        if as_json:
            _echo_json({"workflow_id": wid, "status": "running", "stage": "queued"})
        return EXIT_UNREACHABLE
    deadline = time.monotonic() + timeout_s
    told = False
    pause = 0.2  # a refusal usually lands within a second of the start: look often at first, then each second
    # The run's end is long-polled alongside, so a refusal is printed as soon as planning ends the pipeline,
    # not at the next look; "planned" is a stage, seen only by looking.
    ended = asyncio.ensure_future(client.get_workflow_handle(wid).result(rpc_timeout=None))
    try:
        while time.monotonic() < deadline:
            desc = await oc.describe(client, wid)
            stage = desc.typed_search_attributes.get(sa.STAGE)
            stalled = oc.stalled_workflow_task(desc)
            if stalled is not None and not told:  # a dead worker's poller is still listed: say so within seconds
                _out(oc.no_worker_line(config.temporal.task_queue, f"a workflow task has waited {stalled:.0f} s "
                                       f"for one") + f"; follow it with `python starter.py follow {wid}`", as_json)
                told = True
            if desc.status != WorkflowExecutionStatus.RUNNING:
                return await _print_result(client, wid, as_json)
            if stage not in planning:
                _out(f"planned; building ({stage}). Follow: python starter.py follow {wid}", as_json)
                if as_json:  # stdout carries one JSON document under --json, whatever the path
                    _echo_json({"workflow_id": wid, "status": "running", "stage": stage})
                return EXIT_OK
            await asyncio.wait({ended}, timeout=pause)
            pause = min(1.0, pause * 1.5)
    finally:
        ended.cancel()
        if ended.done() and not ended.cancelled():
            ended.exception()  # the run failed (a refusal): read here, its report says how
    _out(f"still planning after {timeout_s:.0f}s; follow it with `python starter.py follow {wid}`", as_json)
    if as_json:
        _echo_json({"workflow_id": wid, "status": "running", "stage": "planning"})
    return EXIT_OK


async def _is_running(client: Client, wid: str) -> bool:
    from temporalio.client import WorkflowExecutionStatus
    from temporalio.service import RPCError, RPCStatusCode

    from runtime import operator_client as oc

    try:
        return (await client.get_workflow_handle(wid).describe()).status == WorkflowExecutionStatus.RUNNING
    except RPCError as e:
        if e.status == RPCStatusCode.NOT_FOUND:
            return False
        raise oc.service_error(e, wid) from None


async def _start(client, config, request, plan_only, src, harbor, wid):
    from temporalio.common import WorkflowIDConflictPolicy, WorkflowIDReusePolicy

    from domain.models import PipelineInput
    from runtime import search_attributes as sa
    from workflows.pipeline import BuildPipelineWorkflow

    return await client.start_workflow(
        BuildPipelineWorkflow.run,
        PipelineInput(request=request, request_id=wid, plan_only=plan_only, source_commit=src, harbor_commit=harbor),
        id=wid, task_queue=config.temporal.task_queue,
        id_conflict_policy=WorkflowIDConflictPolicy.USE_EXISTING,
        id_reuse_policy=(WorkflowIDReusePolicy.ALLOW_DUPLICATE if plan_only
                         else WorkflowIDReusePolicy.ALLOW_DUPLICATE_FAILED_ONLY),
        search_attributes=_kind(sa.BuildKind.PLAN if plan_only else sa.BuildKind.BUILD),
        static_summary=f"GPU-RL build {src[:12]} + harbor {harbor[:12]} ({', '.join(request.architectures)})",
    )


def _kind(kind: BuildKind) -> TypedSearchAttributes:
    """BuildKind at start, so `status` sorts the run from its first moment (even before a worker runs it)."""
    from temporalio.common import SearchAttributePair, TypedSearchAttributes

    from runtime import search_attributes as sa

    return TypedSearchAttributes([SearchAttributePair(sa.KIND, kind.value)])


async def _print_summary(client: Client, wid: str) -> int:
    """Wait for the pipeline to end, print how it ended in a few lines (``progress.summary_lines``: outcome,
    PR, digests, next step, where the full report is) and return the exit code."""
    from temporalio.client import WorkflowFailureError

    from runtime import operator_client as oc
    from runtime import progress
    from workflows.pipeline import BuildPipelineWorkflow

    try:
        await client.get_workflow_handle_for(BuildPipelineWorkflow.run, wid).result(rpc_timeout=None)
    except WorkflowFailureError:
        pass  # the report says how it ended
    rep = await oc.read_report(client, wid)
    code = oc.exit_code(rep)
    if code == EXIT_USAGE and rep.failure:  # refused input: one line, like any other bad input
        _print_report(rep, False)
        return code
    lines = [printable(line) for line in progress.summary_lines(rep, shutil.get_terminal_size().columns)]
    if code == EXIT_OK:
        click.echo("\n".join(lines))
    else:  # where scripts and eyes look for errors
        click.echo("\n".join(lines), err=True)
    return code


async def _print_result(client: Client, wid: str, as_json: bool) -> int:
    """Wait for the pipeline to end, print its report (read from history) and return the exit code."""
    from temporalio.client import WorkflowFailureError

    from runtime import operator_client as oc
    from workflows.pipeline import BuildPipelineWorkflow

    handle = client.get_workflow_handle_for(BuildPipelineWorkflow.run, wid)
    try:
        await handle.result(rpc_timeout=None)
    except WorkflowFailureError:
        pass  # the report says how it ended
    rep = await oc.read_report(client, wid)
    _print_report(rep, as_json)
    return oc.exit_code(rep)


def _print_report(rep: PipelineReport, as_json: bool) -> None:
    from domain.report import report_markdown
    from runtime import operator_client as oc

    if as_json:
        _echo_json(rep.model_dump_json(indent=2))
        return
    if oc.exit_code(rep) == EXIT_USAGE and rep.failure:  # refused input: one line, like any other bad input
        f = rep.failure
        click.echo(printable(f"error: {f.message} — next step: {f.next_step}"), err=True)
        return
    click.echo(printable(report_markdown(rep, inert=plain_line), multiline=True))
    if rep.failure:  # the reason, once more, where scripts and eyes look for errors
        f = rep.failure
        where = f" at {f.location}" if f.location else ""
        click.echo(printable(f"{rep.status}: {f.failure_class} ({f.error_type}{where}): {f.message}")
                   + "\n" + printable(f"next step: {f.next_step}"), err=True)


# --------------------------------------------------------------------------------------- resume
@cli.command()
@click.argument("workflow_id")
@click.option("--follow", "follow_", is_flag=True, help="Follow progress until the pipeline ends.")
@click.option("--json", "as_json", is_flag=True, help="Print the report as JSON (with --follow).")
@click.pass_context
def resume(ctx, workflow_id, follow_, as_json):
    """Run a failed, cancelled or terminated build again exactly as it was requested.

    Every target an earlier run already validated (image still at its tag, evidence in the store) is
    adopted: no new Iris job; only the others are built. The pin commit and PR already pushed are
    found again (one commit, one PR)."""
    config = _config(ctx)

    async def go():
        from temporalio.client import WorkflowExecutionStatus
        from temporalio.common import WorkflowIDConflictPolicy, WorkflowIDReusePolicy
        from temporalio.exceptions import WorkflowAlreadyStartedError
        from temporalio.service import RPCError

        from runtime import operator_client as oc
        from workflows.pipeline import BuildPipelineWorkflow

        client = await _client(config)
        await oc.pipeline(client, workflow_id)  # unknown or foreign ids: refused, nothing started
        desc = await oc.describe(client, workflow_id)
        if desc.status == WorkflowExecutionStatus.RUNNING:
            _fail(f"{workflow_id} is still running; nothing to resume (`python starter.py follow {workflow_id}`)",
                  EXIT_FAILED)
        if desc.status == WorkflowExecutionStatus.COMPLETED:
            _out(f"{workflow_id} already completed; nothing to resume. Its report:", as_json)
            sys.exit(await _print_result(client, workflow_id, as_json))
        inp = (await oc.started_input(client, workflow_id)).model_copy(update={"resume": None})
        if inp.plan_only:
            _fail(f"{workflow_id} is a plan (--plan): run `python starter.py build ... --plan` again", EXIT_USAGE)
        try:
            handle = await client.start_workflow(
                BuildPipelineWorkflow.run, inp, id=workflow_id, task_queue=config.temporal.task_queue,
                id_conflict_policy=WorkflowIDConflictPolicy.FAIL,
                id_reuse_policy=WorkflowIDReusePolicy.ALLOW_DUPLICATE_FAILED_ONLY,
                static_summary=f"resume of {workflow_id} (validated targets adopted)")
        except WorkflowAlreadyStartedError:
            _fail(f"{workflow_id} was started again meanwhile; follow it with `python starter.py follow "
                  f"{workflow_id}`", EXIT_FAILED)
        except RPCError as e:
            raise oc.service_error(e, f"resume {workflow_id}") from None
        _out(f"workflow: {workflow_id} resumed (run {handle.result_run_id}); targets already validated are "
             "adopted, the others are built", as_json)
        if follow_:
            await _follow(client, workflow_id, config.temporal.task_queue, interval=10.0, as_json=as_json)
            sys.exit(await _print_result(client, workflow_id, as_json))
        sys.exit(await _until_planned(client, config, workflow_id, as_json))

    _run(go())


# --------------------------------------------------------------------------------------- follow
@cli.command()
@click.argument("workflow_id")
@click.option("--interval", default=15.0, show_default=True, help="Seconds between progress lines (≤ 60).")
@click.option("--until-operator", is_flag=True,
              help="Stop following (exit 0) once the build waits for an operator (approve-merge, decide, recheck): "
                   "the command to run is shown; `follow` again watches it to the end.")
@click.pass_context
def follow(ctx, workflow_id, interval, until_operator):
    """Print progress per target until the pipeline ends; Ctrl-C and follow again loses nothing."""
    config = _config(ctx)

    async def go():
        client = await _client(config)
        waiting = await _follow(client, workflow_id, config.temporal.task_queue, max(min(interval, 60.0), 0.5),
                                until_operator=until_operator)
        if waiting:
            from runtime import progress

            click.echo("\n".join(progress.wait_lines(waiting)))
            click.echo(f"stopped following: {workflow_id} waits for an operator (the command above); "
                       f"`python starter.py follow {workflow_id}` watches it to the end")
            sys.exit(EXIT_OK)
        sys.exit(await _print_summary(client, workflow_id))

    _run(go())


# Waits an operator ends with a command (``follow --until-operator`` stops at them).
OPERATOR_WAITS = frozenset({"merge_authorization", "operator_decision", "package_visibility"})


async def _follow(client: Client, wid: str, task_queue: str, interval: float, as_json: bool = False,
                  until_operator: bool = False) -> list | None:
    """Show progress until the pipeline ends: a live table on a TTY, short lines otherwise (on stderr
    under --json, so stdout stays pure JSON). ``until_operator``: return the waits as soon as one is an
    operator's (None when the pipeline ended)."""
    from temporalio.client import WorkflowExecutionStatus
    from temporalio.service import RPCError

    from activities.watch import WatchedProgress
    from domain.models import target_workflow_id
    from runtime import operator_client as oc
    from runtime import progress
    from runtime import search_attributes as sa
    from workflows.pipeline import BuildPipelineWorkflow
    from workflows.target import TargetBuildWorkflow

    await oc.pipeline(client, wid)  # unknown or foreign ids are refused before anything is printed
    handle = client.get_workflow_handle_for(BuildPipelineWorkflow.run, wid)
    stream = sys.stderr if as_json else sys.stdout
    view = (progress.LiveView() if stream.isatty() and not as_json
            else progress.PlainView(lambda line: click.echo(line, err=as_json)))
    live = WatchedProgress(client, task_queue)  # running jobs: live progress from the cluster watcher, fast log reads
    view.note(f"following {wid} (task queue {task_queue}); {_how_to_stop()}")
    lost_since: float | None = None  # Temporal stopped answering at (monotonic)
    no_worker: str | None = None  # the "no worker" line last shown
    ticker = progress.Ticker()
    try:
        while True:
            try:
                desc = await oc.describe(client, wid)
                rep, unanswered = await _timed_query(handle, BuildPipelineWorkflow.report)
                stage = desc.typed_search_attributes.get(sa.STAGE) or desc.status.name.lower()
                statuses = {}
                retries = progress.retrying(await progress.decode_failures(client, desc.raw_description.pending_activities))
                for t in (rep.plan if rep else []):
                    child = client.get_workflow_handle_for(TargetBuildWorkflow.run, target_workflow_id(wid, t.key))
                    statuses[t.key] = await _safe_query(child, TargetBuildWorkflow.status)
                    retries += progress.retrying(await progress.decode_failures(client, await _safe_pending(child)), t.key)
                await live.overlay({t.key: t.cluster for t in (rep.plan if rep else [])}, statuses)
                missing = await _no_worker(client, task_queue, desc, rep is None, unanswered)
            except (CommandError, RPCError) as e:
                err = e if isinstance(e, CommandError) else oc.service_error(e, "Temporal")
                if err.code != EXIT_UNREACHABLE:
                    raise err from None
                # A blip (a restart, a network hiccup): say so and keep trying, for a bounded time.
                now = time.monotonic()
                if lost_since is None:
                    lost_since = now
                    view.note(f"reconnecting… Temporal did not answer ({err.message[:160]}); trying again for "
                              f"up to {RECONNECT_S:.0f} s")
                elif now - lost_since > RECONNECT_S:
                    raise CommandError(f"Temporal did not answer for {now - lost_since:.0f} s: {err.message}; "
                                       f"the build goes on without this terminal — `python starter.py follow {wid}` "
                                       "again later", EXIT_UNREACHABLE) from None
                await asyncio.sleep(RECONNECT_RETRY_S)
                continue
            if lost_since is not None:
                view.note(f"reconnected to Temporal after {time.monotonic() - lost_since:.0f} s")
                lost_since = None
            note, no_worker = progress.worker_note(no_worker, missing, rep is not None and not unanswered,
                                                   task_queue)
            if note:
                view.note(note)
            reasons = progress.waits(rep, statuses) + retries
            view.update(wid, stage, progress.rows(rep, statuses, ticker), reasons)
            if desc.status != WorkflowExecutionStatus.RUNNING:
                return None
            if until_operator and any(w.kind in OPERATOR_WAITS for w in reasons):
                return [w for w in reasons if w.kind in OPERATOR_WAITS]
            # Wake in time for the next line that is due (plain mode prints at least every HEARTBEAT_S).
            due = getattr(view, "due_in", None)
            await asyncio.sleep(max(0.5, min(interval, due() if due else interval)))
    except asyncio.CancelledError:  # Ctrl-C: asyncio.run cancels the command's task wherever it waits
        view.note(f"stopped following {wid}; the build goes on without this terminal — "
                  f"`python starter.py follow {wid}` watches it again")
        raise
    finally:
        view.close()


def _how_to_stop() -> str:
    """What stops following, truthfully: a process started as a background job of a non-interactive shell
    inherits SIGINT ignored (POSIX), and Python keeps it so; Ctrl-C then does nothing, a plain ``kill`` does."""
    import signal

    if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
        return (f"SIGINT is ignored in this process (started in the background?): `kill {os.getpid()}` stops "
                "following, not the build")
    return "Ctrl-C stops following, not the build"


RECONNECT_S = 120.0  # follow keeps trying a silent Temporal this long, then exits 3
RECONNECT_RETRY_S = 2.0


async def _no_worker(client: Client, task_queue: str, desc, no_report: bool, unanswered: bool) -> str | None:
    """The line to show when no worker serves the build's task queue, else None. Fast signs first: a
    workflow task waiting for a worker, or a query nobody answered (a dead worker's poller stays listed
    in DescribeTaskQueue for minutes); then the poller list with its last-access times."""
    from temporalio.client import WorkflowExecutionStatus

    from runtime import operator_client as oc

    if desc.status != WorkflowExecutionStatus.RUNNING:
        return None
    stalled = oc.stalled_workflow_task(desc)
    if stalled is not None:
        return oc.no_worker_line(task_queue, f"a workflow task has waited {stalled:.0f} s for one")
    if no_report and not await oc.has_workers(client, task_queue):
        return oc.no_worker_line(task_queue, "none in the server's poller list has polled in the last "
                                             f"{oc.LIVE_POLLER_S:.0f} s")
    if unanswered:
        return oc.no_worker_line(task_queue, f"no worker answered a query within {QUERY_TIMEOUT_S:.0f} s")
    return None


async def _safe_pending(handle) -> list:
    """The workflow's pending activities (attempt, last failure); empty when it does not exist yet."""
    try:
        return list((await handle.describe()).raw_description.pending_activities)
    except Exception:  # noqa: BLE001 - the child may not exist yet
        return []


QUERY_TIMEOUT_S = 5.0  # a query no worker answers in this long counts as "no worker"


async def _safe_query(handle, query):
    """A typed query (method reference); None when not started yet or no worker answers in time.
    Temporal being unreachable is raised (follow reconnects), not taken for "no worker"."""
    return (await _timed_query(handle, query))[0]


async def _timed_query(handle, query):
    """(result or None, whether the query went unanswered for QUERY_TIMEOUT_S)."""
    from temporalio.service import RPCError, RPCStatusCode

    try:
        return await handle.query(query, rpc_timeout=timedelta(seconds=QUERY_TIMEOUT_S)), False
    except RPCError as e:
        if e.status == RPCStatusCode.UNAVAILABLE:
            raise
        # The server answers at once "no poller seen for task queue recently" when nobody polls: unanswered.
        no_poller = e.status == RPCStatusCode.FAILED_PRECONDITION and "poller" in str(e).lower()
        return None, no_poller or e.status in (RPCStatusCode.DEADLINE_EXCEEDED, RPCStatusCode.CANCELLED)
    except TimeoutError:
        return None, True
    except Exception:  # noqa: BLE001 - not started yet: progress simply unknown
        return None, False


# --------------------------------------------------------------------------------------- status / report
@cli.command()
@click.option("--query", "query", default=None,
              help="Temporal visibility query, e.g. \"BuildStage = 'waiting'\" "
                   "(default: WorkflowType = 'BuildPipelineWorkflow').")
@click.option("--all", "all_kinds", is_flag=True,
              help="Every kind: plans, schedule validations and rebuild checks too (default: BuildKind = 'build').")
@click.option("--limit", default=20, show_default=True)
@click.option("--json", "as_json", is_flag=True, help="Print the rows as JSON.")
@click.pass_context
def status(ctx, query, all_kinds, limit, as_json):
    """List builds (and targets) matching a visibility query: a table with times, or JSON."""
    from runtime import listing, tables

    config = _config(ctx)
    full_query = listing.status_query(query, all_kinds)

    async def go():
        from temporalio.service import RPCError

        from runtime import operator_client as oc

        client = await _client(config)
        try:
            rows = await listing.workflow_rows(client, full_query, limit)
        except RPCError as e:
            raise oc.service_error(e, f"--query {query or full_query!r}") from None
        if as_json:
            _echo_json(rows)
        elif not rows:
            click.echo(f"no matching workflows ({full_query})")
        else:
            tables.render(listing.STATUS_HEADERS, listing.status_table(rows), drop=listing.STATUS_DROP)

    _run(go())


@cli.command()
@click.argument("workflow_id")
@click.option("--format", "fmt", type=click.Choice(["markdown", "json"]), default="markdown", show_default=True)
@click.pass_context
def report(ctx, workflow_id, fmt):
    """Print the pipeline's report (job ids, tags, digests, platforms, validation, PR, merge commit), or a
    rebuild check's decision and why."""
    config = _config(ctx)

    async def go():
        from runtime import operator_client as oc

        client = await _client(config)
        if (await oc.describe(client, workflow_id)).workflow_type == "RebuildCheckWorkflow":
            from runtime.listing import rebuild_check_text

            view = await oc.read_rebuild_check(client, workflow_id)
            if fmt == "json":
                _echo_json(view.as_json())
            else:
                click.echo(printable(rebuild_check_text(view), multiline=True))
            sys.exit(EXIT_FAILED if view.status not in ("completed", "running") else EXIT_OK)
        rep = await oc.read_report(client, workflow_id)  # a finished build: from history, no worker needed
        _print_report(rep, fmt == "json")
        sys.exit(oc.exit_code(rep))

    _run(go())


# --------------------------------------------------------------------------------------- operator decisions
# Failure types of a refused update: a validator's ValueError (workflows/target.py, workflows/pipeline.py; an
# update handler that raises a plain exception fails the workflow task instead, so it never arrives here) and
# the worker's operator check (activities/errors.py NotAuthorized).
UPDATE_REFUSALS = ("ValueError", "NotAuthorized")


async def _send_update(handle, update, arg) -> None:
    """Send an operator update (a method reference). A refusal exits 2 like every other refused request
    (``recheck`` on a target that waits for nothing, an unlisted ``--by``): a validator's (the target is
    not waiting for this, nothing to merge yet) and the worker's operator check; any other failure exits 1."""
    from temporalio.client import WorkflowUpdateFailedError
    from temporalio.service import RPCError

    from runtime import operator_client as oc

    try:
        msg = await handle.execute_update(update, arg)
    except WorkflowUpdateFailedError as e:
        code = EXIT_USAGE if getattr(e.cause, "type", None) in UPDATE_REFUSALS else EXIT_FAILED
        _fail(f"refused: {e.cause.message if e.cause else e}", code)
    except RPCError as e:
        raise oc.service_error(e, handle.id) from None
    click.echo(msg)


def _checked_name(value: str, flag: str) -> str:
    try:
        return operator_name(value, flag=flag)
    except OperatorInputError as e:
        _fail(str(e))
    raise AssertionError


def _note(value: str) -> str:
    try:
        return clean_text(value, flag="--note", required=False) or ""
    except OperatorInputError as e:
        _fail(str(e))
    raise AssertionError


def _operator(config: ServiceConfig, name: str) -> str:
    """``--by`` must name a configured operator; the worker checks again (and a team's members via GitHub)."""
    ops = config.operators
    if not ops.lists(name) and not ops.teams:
        listed = (f"operators.logins: {', '.join(ops.logins)}" if ops.logins
                  else "no [operators] logins or teams configured")
        _fail(f"--by {name}: not a configured operator ({listed})")
    return name


@cli.command("approve-merge")
@click.argument("workflow_id")
@click.option("--by", required=True, help="Configured operator ([operators]) authorizing the merge.")
@click.option("--note", default="")
@click.option("--override-check", "override_checks", multiple=True, metavar="NAME",
              help="Merge although required check NAME is not green (repeatable; needs --reason).")
@click.option("--reason", default="", help="Why the overridden checks do not block (recorded in the PR).")
@click.pass_context
def approve_merge(ctx, workflow_id, by, note, override_checks, reason):
    """Authorize the merge of the pipeline's PR: accepted at once, merged as soon as the required checks are green."""
    from domain.models import MergeAuthorization

    name, note = _checked_name(by, "--by"), _note(note)
    config = _config(ctx)
    try:
        checks = [operator_name(c, flag="--override-check") for c in override_checks]
        why = clean_text(reason, flag="--reason", required=bool(checks)) or ""
    except OperatorInputError as e:
        _fail(str(e))
    auth = MergeAuthorization(by=_operator(config, name), note=note, override_checks=sorted(set(checks)),
                              reason=why)

    async def go():
        from runtime import operator_client as oc
        from workflows.pipeline import BuildPipelineWorkflow

        handle = await oc.pipeline(await _client(config), workflow_id, running=True)
        await _send_update(handle, BuildPipelineWorkflow.approve_merge, auth)

    _run(go())


@cli.command()
@click.argument("workflow_id")
@click.argument("target")
@click.argument("action", type=click.Choice(["retry", "abort"]))
@click.option("--by", required=True, help="Configured operator ([operators]) deciding.")
@click.option("--note", default="")
@click.pass_context
def decide(ctx, workflow_id, target, action, by, note):
    """Answer a target waiting on an unknown failure: retry it or abort it."""
    from domain.models import OperatorDecision

    name, note = _checked_name(by, "--by"), _note(note)
    config = _config(ctx)
    decision = OperatorDecision(action=action, by=_operator(config, name), note=note)

    async def go():
        from runtime import operator_client as oc
        from workflows.target import TargetBuildWorkflow

        handle = await oc.target(await _client(config), workflow_id, target, running=True)
        await _send_update(handle, TargetBuildWorkflow.decide, decision)

    _run(go())


@cli.command()
@click.argument("workflow_id")
@click.argument("target")
@click.pass_context
def recheck(ctx, workflow_id, target):
    """Re-run validation of TARGET now (e.g. after making the package public). No rebuild.

    Refused (exit 2, nothing sent) when TARGET is unknown, finished, or waits for something else."""
    config = _config(ctx)

    async def go():
        from temporalio.client import WorkflowExecutionStatus
        from temporalio.service import RPCError

        from domain.outcome import recheck_refusal
        from runtime import operator_client as oc
        from runtime import search_attributes as sa
        from workflows.target import TargetBuildWorkflow

        client = await _client(config)
        handle = await oc.target(client, workflow_id, target)
        desc = await oc.describe(client, handle.id)
        attrs = desc.typed_search_attributes
        refusal = recheck_refusal(workflow_id, target, running=desc.status == WorkflowExecutionStatus.RUNNING,
                                  status=desc.status.name.lower() if desc.status else "unknown",
                                  stage=attrs.get(sa.STAGE), failure_class=attrs.get(sa.FAILURE_CLASS))
        if refusal:
            _fail(printable(refusal), EXIT_USAGE)
        try:
            await handle.signal(TargetBuildWorkflow.recheck)
        except RPCError as e:
            raise oc.service_error(e, handle.id) from None
        click.echo(f"re-check requested for {target}")

    _run(go())


@cli.command()
@click.argument("workflow_id")
@click.pass_context
def cancel(ctx, workflow_id):
    """Cancel the pipeline; its own Iris jobs are terminated (exact ids), nothing else on the cluster."""
    config = _config(ctx)

    async def go():
        from temporalio.service import RPCError

        from runtime import operator_client as oc

        handle = await oc.pipeline(await _client(config), workflow_id, running=True)
        try:
            await handle.cancel()
        except RPCError as e:
            raise oc.service_error(e, workflow_id) from None
        click.echo(f"cancellation requested for {workflow_id}; `python starter.py report {workflow_id}` "
                   "shows it cancelled once its jobs are terminated")

    _run(go())


# --------------------------------------------------------------------------------------- schedules
@cli.group()
def schedule():
    """Scheduled rebuild checks: a rebuild runs only when something that reaches the image changed."""


@schedule.command("create")
@click.argument("schedule_id")
@click.option("--every", "every_h", type=float, help="Run the check every N hours.")
@click.option("--cron", help="Cron expression (UTC), e.g. '0 2 * * *'.")
@click.option("--arch", "architectures", multiple=True, required=True)
@click.option("--variant", "variants", multiple=True, default=("standard", "megatron"), show_default=True)
@click.option("--cluster", "clusters", multiple=True, metavar="ARCH=CLUSTER", help="Cluster override per architecture.")
@click.option("--requested-by", required=True)
@click.option("--reason", required=True)
@click.option("--link")
@click.option("--note", default="")
@click.pass_context
def schedule_create(ctx, schedule_id, every_h, cron, architectures, variants, clusters, requested_by, reason, link,
                    note):
    """Create a schedule that runs the rebuild check (overlap policy: skip).

    The request is validated like a build's before the schedule exists: same input rules, and it is
    planned once on a worker (nothing submitted), so an unknown architecture is refused now rather
    than by every trigger."""
    if (every_h is None) == (cron is None):
        _fail("pass exactly one of --every or --cron")
    if every_h is not None and not 0 < every_h <= 24 * 366:
        _fail(f"--every {every_h:g}: expected hours between 0 and {24 * 366}")
    try:
        schedule_id = clean_text(schedule_id, flag="SCHEDULE_ID", max_len=MAX_NAME)
        if not SCHEDULE_ID.fullmatch(schedule_id):
            raise OperatorInputError(f"SCHEDULE_ID {schedule_id[:80]!r}: expected letters, digits, '.', '_' or '-' "
                                     "(starting with a letter or digit), e.g. nightly-amd64")
        cron = clean_text(cron, flag="--cron", max_len=MAX_NAME, required=False)
        note = clean_text(note, flag="--note", required=False) or ""
        request = build_request(architectures=architectures, variants=variants, requested_by=requested_by,
                                reason=reason, link=link, clusters=clusters)
    except OperatorInputError as e:
        _fail(str(e))
    config = _config(ctx, request)

    async def go():
        from temporalio.client import (
            Schedule,
            ScheduleActionStartWorkflow,
            ScheduleIntervalSpec,
            ScheduleOverlapPolicy,
            SchedulePolicy,
            ScheduleSpec,
            ScheduleState,
        )
        from temporalio.service import RPCError, RPCStatusCode

        from domain.models import RebuildCheckInput
        from runtime import operator_client as oc
        from runtime import search_attributes as sa
        from workflows.rebuild import RebuildCheckWorkflow

        client = await _client(config)
        try:
            if await client.get_schedule_handle(schedule_id).describe():
                _fail(f"schedule {schedule_id} already exists; delete it first or pick another id")
        except RPCError as e:
            if e.status != RPCStatusCode.NOT_FOUND:
                raise oc.service_error(e, f"schedule {schedule_id}") from None
        await _validate_by_plan(client, config, request, f"schedule-{schedule_id}")
        spec = (ScheduleSpec(intervals=[ScheduleIntervalSpec(every=timedelta(hours=every_h))]) if every_h
                else ScheduleSpec(cron_expressions=[cron], time_zone_name="UTC"))
        try:
            await client.create_schedule(schedule_id, Schedule(
                action=ScheduleActionStartWorkflow(RebuildCheckWorkflow.run, RebuildCheckInput(request=request),
                                                   id=f"rebuild-check-{schedule_id}",
                                                   task_queue=config.temporal.task_queue,
                                                   typed_search_attributes=_kind(sa.BuildKind.REBUILD_CHECK)),
                spec=spec, policy=SchedulePolicy(overlap=ScheduleOverlapPolicy.SKIP),
                state=ScheduleState(note=note or f"rebuild check for {', '.join(request.architectures)}")),
                # the operator's own words for "how often" (the server keeps a cron only as calendar rules)
                memo={"spec": f"every {every_h:g}h" if every_h else f"cron '{cron}' (UTC)"})
        except RPCError as e:
            raise oc.service_error(e, f"schedule {schedule_id}") from None
        except ValueError as e:  # the SDK's own checks (e.g. a malformed spec)
            _fail(f"schedule {schedule_id}: {e}")
        click.echo(f"schedule {schedule_id} created")

    _run(go())


async def _validate_by_plan(client: Client, config: ServiceConfig, request, label: str) -> None:
    """Plan ``request`` on a worker exactly as ``build --plan`` does (nothing submitted or pushed);
    a refused plan is a refused command (exit 2 for input, 1 otherwise)."""
    from temporalio.client import WorkflowFailureError
    from temporalio.common import WorkflowIDConflictPolicy, WorkflowIDReusePolicy
    from temporalio.service import RPCError

    from domain.models import PipelineInput, pipeline_id
    from runtime import operator_client as oc
    from runtime import search_attributes as sa
    from workflows.pipeline import BuildPipelineWorkflow

    if not await oc.has_workers(client, config.temporal.task_queue):
        _fail(f"cannot validate the request: no worker polls task queue {config.temporal.task_queue} "
              "(start worker.py, then try again)", EXIT_UNREACHABLE)
    src, harbor = _heads(config, request)
    wid = f"{pipeline_id(src, harbor)}-plan-{label}"
    try:
        handle = await client.start_workflow(
            BuildPipelineWorkflow.run,
            PipelineInput(request=request, request_id=wid, plan_only=True, source_commit=src, harbor_commit=harbor),
            id=wid, task_queue=config.temporal.task_queue, id_reuse_policy=WorkflowIDReusePolicy.ALLOW_DUPLICATE,
            id_conflict_policy=WorkflowIDConflictPolicy.TERMINATE_EXISTING,
            search_attributes=_kind(sa.BuildKind.VALIDATION),
            static_summary=f"validate the request of {label} (plan only)")
        try:
            await asyncio.wait_for(handle.result(), 600)
        except WorkflowFailureError:
            pass
        except TimeoutError:
            _fail(f"cannot validate the request: its plan {wid} did not finish within 600 s", EXIT_UNREACHABLE)
    except RPCError as e:
        raise oc.service_error(e, wid) from None
    rep = await oc.read_report(client, wid)
    if rep.status != "planned":
        f = rep.failure
        _fail(f"request refused by its plan ({wid}): {f.message if f else rep.message}"
              + (f"; next step: fix {f.location}" if f and f.location else ""), oc.exit_code(rep) or EXIT_FAILED)


@schedule.command("list")
@click.option("--json", "as_json", is_flag=True, help="Print the rows as JSON.")
@click.pass_context
def schedule_list(ctx, as_json):
    """List schedules: state, how often, next and last run, and what the last check decided."""
    from runtime import listing, tables

    config = _config(ctx)

    async def go():
        from temporalio.service import RPCError

        from runtime import operator_client as oc

        client = await _client(config)
        try:
            rows = await listing.schedule_rows(client)
        except RPCError as e:
            raise oc.service_error(e, "schedule list") from None
        if as_json:
            _echo_json(rows)
        elif not rows:
            click.echo("no schedules (create one with `python starter.py schedule create ...`)")
        else:
            tables.render(listing.SCHEDULE_HEADERS, listing.schedule_table(rows), drop=listing.SCHEDULE_DROP)

    _run(go())


def _schedule_cmd(name: str, doc: str):
    @schedule.command(name, help=doc)
    @click.argument("schedule_id")
    @click.pass_context
    def _cmd(ctx, schedule_id, as_json=False, force=False):
        from temporalio.client import ScheduleOverlapPolicy
        from temporalio.service import RPCError, RPCStatusCode

        from runtime import operator_client as oc

        config = _config(ctx)

        async def go():
            client = await _client(config)
            h = client.get_schedule_handle(schedule_id)
            try:
                if name == "describe":
                    from runtime import listing

                    desc = await listing.schedule_description(client, schedule_id)
                    if as_json:
                        _echo_json(desc)
                    else:
                        click.echo(printable(listing.schedule_text(desc), multiline=True))
                elif name == "pause":
                    await h.pause(note="paused from starter.py")
                elif name == "unpause":
                    await h.unpause(note="unpaused from starter.py")
                elif name == "delete":
                    await h.delete()
                elif name == "trigger" and force:
                    wid = await _forced_check(client, config, h)
                    click.echo(f"schedule {schedule_id}: forced rebuild check {wid} started (a rebuild an operator "
                               f"cancelled for these commits starts again); `python starter.py report {wid}`")
                    return
                elif name == "trigger":
                    await h.trigger(overlap=ScheduleOverlapPolicy.SKIP)
            except RPCError as e:
                code = EXIT_FAILED if e.status == RPCStatusCode.NOT_FOUND else oc.service_error(e, "").code
                _fail(f"schedule {schedule_id}: {(e.message or str(e)).splitlines()[0][:300]}", code)
            if name != "describe":
                click.echo(f"schedule {schedule_id}: {name} done")

        _run(go())

    return _cmd


for _name, _doc in (("describe", "Show a schedule: when it runs, what it checks, what its recent checks decided."),
                    ("pause", "Pause a schedule."), ("unpause", "Unpause a schedule."),
                    ("delete", "Delete a schedule."), ("trigger", "Run the rebuild check now.")):
    _cmd = _schedule_cmd(_name, _doc)
    if _name == "describe":
        click.option("--json", "as_json", is_flag=True, help="Print it as JSON.")(_cmd)
    if _name == "trigger":
        click.option("--force", is_flag=True, help="Start the rebuild even if an operator cancelled it for the "
                     "same source and Harbor commits (a cancel is otherwise remembered until they change).")(_cmd)


async def _forced_check(client, config: ServiceConfig, handle) -> str:
    """One rebuild check with the schedule's own request and ``force``: outside the schedule, so the
    schedule's next runs still respect the cancel; named after the schedule's workflow id."""
    from datetime import UTC, datetime

    from domain.models import RebuildCheckInput
    from runtime import search_attributes as sa
    from workflows.rebuild import RebuildCheckWorkflow

    action = (await handle.describe()).schedule.action
    inp = (await client.data_converter.decode(list(action.args), [RebuildCheckInput]))[0]
    wid = f"{action.id}-forced-{datetime.now(UTC):%Y%m%dT%H%M%SZ}"
    await client.start_workflow(RebuildCheckWorkflow.run, inp.model_copy(update={"force": True}), id=wid,
                                task_queue=action.task_queue, search_attributes=_kind(sa.BuildKind.REBUILD_CHECK))
    return wid

# --------------------------------------------------------------------------------------- evidence
async def _evidence_items(config: ServiceConfig, wid: str):
    """Evidence references from history (no worker needed); an unknown id is bad input."""
    from temporalio.service import RPCError, RPCStatusCode

    from runtime.evidence import collect

    client = await _client(config)
    try:
        return await collect(client, wid)
    except RPCError as e:
        if e.status == RPCStatusCode.NOT_FOUND:
            _fail(f"{wid}: no such workflow in namespace {config.temporal.namespace}")
        _fail(f"cannot read the history of {wid}: {e.message}", EXIT_UNREACHABLE)


@cli.command()
@click.argument("workflow_id")
@click.argument("target", required=False)
@click.option("--full", is_flag=True, help="Print the whole log, not only the lines around the failing one.")
@click.pass_context
def logs(ctx, workflow_id, target, full):
    """Print the failing step's log excerpt of each failed target (or of TARGET), from the evidence store."""
    from runtime.evidence import EvidenceError, failed_steps, render_failed_step

    config = _config(ctx)

    async def go():
        items = await _evidence_items(config, workflow_id)
        targets = sorted({i.target for i in items})
        if target and target not in targets:
            _fail(f"{workflow_id} has no evidence for target {target!r} (targets with evidence: "
                  f"{', '.join(targets) or 'none'})")
        steps = failed_steps(items, target)
        if not steps:
            click.echo(f"no failed step recorded for {workflow_id}{' ' + target if target else ''}", err=True)
            return
        for step in steps:
            try:
                click.echo("\n".join(render_failed_step(step, config.evidence.storage_options, full=full)))
            except EvidenceError as e:
                _fail(str(e), EXIT_UNREACHABLE)

    _run(go())


@cli.command()
@click.argument("workflow_id")
@click.option("--download", "dest", type=click.Path(file_okay=False), help="Copy every file (sha256-checked) here.")
@click.option("--json", "as_json", is_flag=True, help="List as JSON.")
@click.pass_context
def evidence(ctx, workflow_id, dest, as_json):
    """List (or download) every log and diagnostics file of a build: store URI, size, sha256."""
    from pathlib import Path

    from runtime.evidence import EvidenceError, download

    config = _config(ctx)

    async def go():
        items = await _evidence_items(config, workflow_id)
        if dest:
            try:
                for path in download(items, Path(dest), config.evidence.storage_options):
                    click.echo(printable(str(path)))
            except EvidenceError as e:
                _fail(str(e), EXIT_UNREACHABLE)
            return
        rows = [{"target": i.target, "kind": i.kind, "job_id": i.job_id, "failure_class": i.failure_class,
                 **i.ref.model_dump()} for i in items]
        if as_json:
            _echo_json(rows)
            return
        if not rows:
            click.echo(f"no evidence recorded for {workflow_id}", err=True)
        for r in rows:
            click.echo(printable(f"{r['target']:<16} {r['kind']:<12} {r['size_bytes']:>9} B  sha256:{r['sha256'][:16]}  "
                                 f"{r['uri']}"))

    _run(go())


def main() -> None:
    """Run the CLI and leave with ``os._exit``: the Temporal runtime's threads can abort a normal
    interpreter exit (sdk-python#300), which would turn a finished command into SIGABRT."""
    code = 0
    try:
        cli.main(obj={}, standalone_mode=False)
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
    except click.exceptions.Abort:
        click.echo("aborted", err=True)
        code = 130
    except click.ClickException as e:
        e.show()
        code = e.exit_code
    except CommandError as e:  # a command that cannot do what was asked: one line, no traceback
        click.echo(f"error: {e.message}", err=True)
        code = e.code
    except Exception as e:
        # Any service error not mapped closer to its command; the SDK is loaded only if a command used it.
        service = sys.modules.get("temporalio.service")
        if service is None or not isinstance(e, service.RPCError):
            raise
        from runtime import operator_client as oc

        err = oc.service_error(e, "Temporal")
        click.echo(f"error: {err.message}", err=True)
        code = err.code
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


if __name__ == "__main__":
    main()
