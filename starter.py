"""gpu-rl-builder's operator CLI: start builds, follow them, decide, approve merges, manage schedules.

Every command talks to Temporal only; nothing depends on this terminal staying open. Exit codes:
0 success, 1 the build (or command target) failed, 2 bad input/usage, 3 cannot reach a service.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import time
from datetime import timedelta

import click
from temporalio.client import (
    Client,
    Schedule,
    ScheduleActionStartWorkflow,
    ScheduleIntervalSpec,
    ScheduleOverlapPolicy,
    SchedulePolicy,
    ScheduleSpec,
    ScheduleState,
    WorkflowExecutionStatus,
    WorkflowFailureError,
    WorkflowUpdateFailedError,
)
from temporalio.common import WorkflowIDConflictPolicy, WorkflowIDReusePolicy
from temporalio.exceptions import WorkflowAlreadyStartedError
from temporalio.service import RPCError, RPCStatusCode

from domain.buildset import BuildRequest, CompatibilityRequest
from domain.config import ConfigError, ServiceConfig, load_config
from domain.models import (
    MergeAuthorization,
    OperatorDecision,
    PipelineInput,
    PipelineReport,
    TargetStatus,
    pipeline_id,
)
from domain.outcome import waiting_line
from domain.report import report_markdown
from runtime import search_attributes as sa
from runtime.temporal import connect, connection_options, flags_from, resolve_config, workflow_ui_url

EXIT_OK, EXIT_FAILED, EXIT_USAGE, EXIT_UNREACHABLE = 0, 1, 2, 3


def ls_remote_head(url: str, ref: str | None = None) -> str:
    """The commit a remote's default branch (or ``ref``) points at, read without cloning."""
    import git

    if ref and len(ref) == 40 and all(c in "0123456789abcdef" for c in ref):
        return ref
    out = git.cmd.Git().ls_remote(url, ref or "HEAD")
    for line in out.splitlines():
        sha, _, name = line.partition("\t")
        if ref is None or name in (f"refs/heads/{ref}", f"refs/tags/{ref}", f"refs/tags/{ref}^{{}}"):
            return sha
    raise ValueError(f"{ref or 'HEAD'} not found in {url}")


def _fail(msg: str, code: int = EXIT_USAGE) -> None:
    click.echo(f"error: {msg}", err=True)
    sys.exit(code)


def _config(ctx: click.Context) -> ServiceConfig:
    try:
        return resolve_config(load_config(ctx.obj["config_path"]), ctx.obj.get("temporal_flags"))
    except ConfigError as e:
        _fail(str(e))
    raise AssertionError  # unreachable


async def _client(config: ServiceConfig) -> Client:
    try:
        return await connect(config)
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
@click.option("--plan", "plan_only", is_flag=True, help="Resolve everything, submit nothing, print the plan.")
@click.option("--follow", "follow_", is_flag=True, help="Follow progress until the pipeline ends.")
@click.option("--json", "as_json", is_flag=True, help="Print the plan/report as JSON.")
@click.pass_context
def build(ctx, architectures, variants, requested_by, reason, link, clusters, priority, harbor_ref,
          push_floating, issue_url, plan_only, follow_, as_json):
    """Start (or attach to) the build pipeline for the latest MarinSkyRL + Harbor commits."""
    if not requested_by or not reason:
        _fail("a compatibility image must be explicitly requested: pass --requested-by and --reason "
              "(maintained Iris training uses the standard task image and must not use this build path)")
    overrides = {}
    for item in clusters:
        if "=" not in item:
            _fail(f"--cluster {item!r}: expected ARCH=CLUSTER")
        a, c = item.split("=", 1)
        overrides[a.strip()] = c.strip()
    try:
        request = BuildRequest(
            architectures=list(architectures), variants=list(variants),
            compatibility_request=CompatibilityRequest(requested_by=requested_by, reason=reason, link=link),
            clusters=overrides, priority=priority, harbor_ref=harbor_ref, push_floating=push_floating,
            issue_url=issue_url)
    except ValueError as e:
        _fail(f"invalid build request: {e}")
    config = _config(ctx)
    _run(_build(config, request, plan_only, follow_, as_json))


async def _build(config, request, plan_only, follow_, as_json):
    try:
        src = ls_remote_head(config.repos.marinskyrl_url)
        harbor = ls_remote_head(config.repos.harbor_url, request.harbor_ref)
    except Exception as e:  # noqa: BLE001 - report any git failure as unreachable
        _fail(f"cannot read the default branches: {e}", EXIT_UNREACHABLE)
    wid = pipeline_id(src, harbor) + ("-plan" if plan_only else "")
    client = await _client(config)
    running = await _is_running(client, wid)
    try:
        handle = await _start(client, config, request, plan_only, src, harbor, wid)
    except WorkflowAlreadyStartedError:
        click.echo(f"workflow: {wid} already completed for source {src[:12]} + harbor {harbor[:12]}; "
                   "not starting a duplicate. Its report:")
        sys.exit(await _print_result(client, wid, as_json))
    click.echo(f"workflow: {handle.id}{' (attached to the running pipeline)' if running else ''}")
    url = workflow_ui_url(config, wid)
    if url:
        click.echo(f"ui: {url}")
    if plan_only or follow_:
        if follow_ and not plan_only:
            await _follow(client, wid, interval=10.0)
        code = await _print_result(client, wid, as_json)
        sys.exit(code)


async def _is_running(client: Client, wid: str) -> bool:
    try:
        return (await client.get_workflow_handle(wid).describe()).status == WorkflowExecutionStatus.RUNNING
    except RPCError:
        return False


async def _start(client, config, request, plan_only, src, harbor, wid):
    from workflows.pipeline import BuildPipelineWorkflow

    return await client.start_workflow(
        BuildPipelineWorkflow.run,
        PipelineInput(request=request, request_id=wid, plan_only=plan_only, source_commit=src, harbor_commit=harbor),
        id=wid, task_queue=config.temporal.task_queue,
        id_conflict_policy=WorkflowIDConflictPolicy.USE_EXISTING,
        id_reuse_policy=(WorkflowIDReusePolicy.ALLOW_DUPLICATE if plan_only
                         else WorkflowIDReusePolicy.ALLOW_DUPLICATE_FAILED_ONLY),
        static_summary=f"GPU-RL build {src[:12]} + harbor {harbor[:12]} ({', '.join(request.architectures)})",
    )


async def _print_result(client: Client, wid: str, as_json: bool) -> int:
    handle = client.get_workflow_handle(wid)
    try:
        rep = await handle.result(rpc_timeout=None)
        rep = rep if isinstance(rep, PipelineReport) else PipelineReport.model_validate(rep)
        code = EXIT_OK
    except WorkflowFailureError:
        rep = await handle.query("report", result_type=PipelineReport)
        code = EXIT_FAILED
    click.echo(rep.model_dump_json(indent=2) if as_json else report_markdown(rep))
    return code


# --------------------------------------------------------------------------------------- follow
@cli.command()
@click.argument("workflow_id")
@click.option("--interval", default=15.0, show_default=True, help="Seconds between progress lines (≤ 60).")
@click.pass_context
def follow(ctx, workflow_id, interval):
    """Print progress per target until the pipeline ends; Ctrl-C and follow again loses nothing."""
    config = _config(ctx)

    async def go():
        client = await _client(config)
        await _follow(client, workflow_id, min(interval, 60.0))
        sys.exit(await _print_result(client, workflow_id, False))

    _run(go())


async def _follow(client: Client, wid: str, interval: float) -> None:
    handle = client.get_workflow_handle(wid)
    last, printed_at = None, 0.0
    while True:
        try:
            desc = await handle.describe()
        except RPCError as e:
            _fail(f"{wid}: {e.message}", EXIT_FAILED)
        stage = await _safe_query(handle, "stage", str)
        rep = await _safe_query(handle, "report", PipelineReport)
        lines = [f"[{stage or desc.status.name.lower()}] {wid}"]
        for t in (rep.plan if rep else []):
            st = await _safe_query(client.get_workflow_handle(f"{wid}/{t.key}"), "status", TargetStatus)
            lines.append("  " + _status_line(t.key, st))
        text = "\n".join(lines)
        now = asyncio.get_running_loop().time()
        if text != last or now - printed_at >= 55:  # a line at least once a minute, even when idle
            head, _, rest = text.partition("\n")
            click.echo(f"{head}  ({time.strftime('%H:%M:%S')})" + (f"\n{rest}" if rest else ""))
            last, printed_at = text, now
        if desc.status != WorkflowExecutionStatus.RUNNING:
            return
        await asyncio.sleep(interval)


def _status_line(key: str, st: TargetStatus | None) -> str:
    if st is None:
        return f"{key}: not started"
    p = st.progress
    bits = [f"{key}: {st.stage.value}"]
    if p:
        bits.append(f"job {p.job_id} {p.state} attempt {p.attempt} preemptions {p.preemptions} "
                    f"elapsed {int(p.elapsed_s)}s")
        if p.last_marker:
            bits.append(f"last marker: {p.last_marker!r}")
        if not p.controller_reachable:
            bits.append("(controller unreachable; still polling)")
    if st.failure_class:
        bits.append(f"failure class: {st.failure_class}")
    if st.validation_ok is not None:
        bits.append("validated" if st.validation_ok else "validation failed")
    if st.waiting:
        bits.append(f"WAITING: {waiting_line(st.waiting)}")
    return " | ".join(bits)


async def _safe_query(handle, name, result_type):
    try:
        return await handle.query(name, result_type=result_type)
    except Exception:  # noqa: BLE001 - not started yet / no worker: progress simply unknown
        return None


# --------------------------------------------------------------------------------------- status / report
@cli.command()
@click.option("--query", "query", default="WorkflowType = 'BuildPipelineWorkflow'", show_default=True,
              help="Temporal visibility query, e.g. \"BuildStage = 'waiting'\".")
@click.option("--limit", default=20, show_default=True)
@click.pass_context
def status(ctx, query, limit):
    """List pipelines (and targets) matching a visibility query."""
    config = _config(ctx)

    async def go():
        client = await _client(config)
        n = 0
        async for wf in client.list_workflows(query, limit=limit):
            attrs = wf.typed_search_attributes
            stage = attrs.get(sa.STAGE) or "-"
            fclass = attrs.get(sa.FAILURE_CLASS) or ""
            click.echo(f"{wf.id}\t{wf.status.name.lower()}\tstage={stage}\t{fclass}")
            n += 1
        if n == 0:
            click.echo("no matching workflows")

    _run(go())


@cli.command()
@click.argument("workflow_id")
@click.option("--format", "fmt", type=click.Choice(["markdown", "json"]), default="markdown", show_default=True)
@click.pass_context
def report(ctx, workflow_id, fmt):
    """Print the pipeline's report (job ids, tags, digests, platforms, validation, PR, merge commit)."""
    config = _config(ctx)

    async def go():
        client = await _client(config)
        rep = await _safe_query(client.get_workflow_handle(workflow_id), "report", PipelineReport)
        if rep is None:
            _fail(f"{workflow_id}: no report (unknown workflow, or no worker running)", EXIT_FAILED)
        click.echo(rep.model_dump_json(indent=2) if fmt == "json" else report_markdown(rep))

    _run(go())


# --------------------------------------------------------------------------------------- operator decisions
async def _send_update(config: ServiceConfig, wid: str, update: str, arg) -> None:
    """Send an operator update; a validator's refusal is printed and exits 1."""
    client = await _client(config)
    try:
        msg = await client.get_workflow_handle(wid).execute_update(update, arg, result_type=str)
    except WorkflowUpdateFailedError as e:
        _fail(f"refused: {e.cause.message if e.cause else e}", EXIT_FAILED)
    click.echo(msg)


@cli.command("approve-merge")
@click.argument("workflow_id")
@click.option("--by", required=True, help="Operator authorizing the merge.")
@click.option("--note", default="")
@click.pass_context
def approve_merge(ctx, workflow_id, by, note):
    """Authorize the merge of the pipeline's PR (refused while checks are pending or red)."""
    config = _config(ctx)

    _run(_send_update(config, workflow_id, "approve_merge", MergeAuthorization(by=by, note=note)))


@cli.command()
@click.argument("workflow_id")
@click.argument("target")
@click.argument("action", type=click.Choice(["retry", "abort"]))
@click.option("--by", default="operator")
@click.option("--note", default="")
@click.pass_context
def decide(ctx, workflow_id, target, action, by, note):
    """Answer a target waiting on an unknown failure: retry it or abort it."""
    config = _config(ctx)

    _run(_send_update(config, f"{workflow_id}/{target}", "decide",
                      OperatorDecision(action=action, by=by, note=note)))


@cli.command()
@click.argument("workflow_id")
@click.argument("target")
@click.pass_context
def recheck(ctx, workflow_id, target):
    """Re-run validation of TARGET now (e.g. after making the package public). No rebuild."""
    config = _config(ctx)

    async def go():
        client = await _client(config)
        await client.get_workflow_handle(f"{workflow_id}/{target}").signal("recheck")
        click.echo(f"re-check requested for {target}")

    _run(go())


@cli.command()
@click.argument("workflow_id")
@click.pass_context
def cancel(ctx, workflow_id):
    """Cancel the pipeline; its own Iris jobs are terminated (exact ids), nothing else on the cluster."""
    config = _config(ctx)

    async def go():
        client = await _client(config)
        await client.get_workflow_handle(workflow_id).cancel()
        click.echo(f"cancellation requested for {workflow_id}")

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
@click.option("--requested-by", required=True)
@click.option("--reason", required=True)
@click.option("--link")
@click.option("--note", default="")
@click.pass_context
def schedule_create(ctx, schedule_id, every_h, cron, architectures, variants, requested_by, reason, link, note):
    """Create a schedule that runs the rebuild check (overlap policy: skip)."""
    if bool(every_h) == bool(cron):
        _fail("pass exactly one of --every or --cron")
    config = _config(ctx)
    request = BuildRequest(architectures=list(architectures), variants=list(variants),
                           compatibility_request=CompatibilityRequest(requested_by=requested_by, reason=reason,
                                                                      link=link))

    async def go():
        from domain.models import RebuildCheckInput
        from workflows.rebuild import RebuildCheckWorkflow

        client = await _client(config)
        spec = (ScheduleSpec(intervals=[ScheduleIntervalSpec(every=timedelta(hours=every_h))]) if every_h
                else ScheduleSpec(cron_expressions=[cron], time_zone_name="UTC"))
        await client.create_schedule(schedule_id, Schedule(
            action=ScheduleActionStartWorkflow(RebuildCheckWorkflow.run, RebuildCheckInput(request=request),
                                               id=f"rebuild-check-{schedule_id}", task_queue=config.temporal.task_queue),
            spec=spec, policy=SchedulePolicy(overlap=ScheduleOverlapPolicy.SKIP),
            state=ScheduleState(note=note or f"rebuild check for {', '.join(architectures)}")))
        click.echo(f"schedule {schedule_id} created")

    _run(go())


@schedule.command("list")
@click.pass_context
def schedule_list(ctx):
    config = _config(ctx)

    async def go():
        client = await _client(config)
        async for s in await client.list_schedules():
            paused = s.schedule.state.paused if s.schedule and s.schedule.state else "?"
            click.echo(f"{s.id}\tpaused={paused}")

    _run(go())


def _schedule_cmd(name: str, doc: str):
    @schedule.command(name, help=doc)
    @click.argument("schedule_id")
    @click.pass_context
    def _cmd(ctx, schedule_id):
        config = _config(ctx)

        async def go():
            client = await _client(config)
            h = client.get_schedule_handle(schedule_id)
            try:
                if name == "describe":
                    d = await h.describe()
                    info = d.info
                    click.echo(json.dumps({
                        "id": d.id, "paused": d.schedule.state.paused, "note": d.schedule.state.note,
                        "recent_actions": [a.action.workflow_id for a in info.recent_actions],
                        "next_action_times": [t.isoformat() for t in info.next_action_times[:3]],
                    }, indent=2))
                elif name == "pause":
                    await h.pause(note="paused from starter.py")
                elif name == "unpause":
                    await h.unpause(note="unpaused from starter.py")
                elif name == "delete":
                    await h.delete()
                elif name == "trigger":
                    await h.trigger(overlap=ScheduleOverlapPolicy.SKIP)
            except RPCError as e:
                _fail(f"schedule {schedule_id}: {e.message}", EXIT_FAILED)
            if name != "describe":
                click.echo(f"schedule {schedule_id}: {name} done")

        _run(go())

    return _cmd


for _name, _doc in (("describe", "Show a schedule."), ("pause", "Pause a schedule."),
                    ("unpause", "Unpause a schedule."), ("delete", "Delete a schedule."),
                    ("trigger", "Run the rebuild check now.")):
    _schedule_cmd(_name, _doc)

# --------------------------------------------------------------------------------------- evidence
async def _evidence_items(config: ServiceConfig, wid: str):
    """Evidence references from history (no worker needed); an unknown id is bad input."""
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
                    click.echo(str(path))
            except EvidenceError as e:
                _fail(str(e), EXIT_UNREACHABLE)
            return
        rows = [{"target": i.target, "kind": i.kind, "job_id": i.job_id, "failure_class": i.failure_class,
                 **i.ref.model_dump()} for i in items]
        if as_json:
            click.echo(json.dumps(rows, indent=2))
            return
        if not rows:
            click.echo(f"no evidence recorded for {workflow_id}", err=True)
        for r in rows:
            click.echo(f"{r['target']:<16} {r['kind']:<12} {r['size_bytes']:>9} B  sha256:{r['sha256'][:16]}  {r['uri']}")

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
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


if __name__ == "__main__":
    main()
