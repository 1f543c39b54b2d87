"""The gpu-rl-builder worker: runs the pipeline and target workflows and every activity.

Run: ``gpu-rl-builder-worker --config config.toml`` (or ``python worker.py``; or set
GPU_RL_BUILDER_CONFIG); ``--address/--namespace/--profile`` and TEMPORAL_* pick the server. SIGTERM drains
gracefully: in-flight activities get ``--graceful-shutdown`` seconds, and any that do not finish are
retried by another worker because every side effect is idempotent.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import os
import signal
import socket
import sys
from datetime import timedelta

import click
from temporalio.worker import PollerBehaviorSimpleMaximum, Worker

from activities.build import BuildActivities
from activities.common import HEARTBEAT_EVERY_S
from activities.merge_gate import OperatorActivities
from activities.preflight import PreflightActivities
from activities.record import RecordActivities
from activities.source import SourceActivities
from activities.watch import WatchActivities
from clients.credentials import CredentialError, fetch_secret
from domain.config import ConfigError, load_config
from domain.watch import watcher_task_queue
from runtime import health, webhooks
from runtime.logging import configure_logging, get_logger
from runtime.temporal import (
    ConnectionFlags,
    connect,
    connection_options,
    describe,
    flags_from,
    resolve_config,
)
from runtime.tools import missing_tools
from runtime.version import version
from workflows.pipeline import BuildPipelineWorkflow
from workflows.rebuild import RebuildCheckWorkflow
from workflows.target import TargetBuildWorkflow
from workflows.watcher import IrisWatcherWorkflow

WORKFLOWS = [BuildPipelineWorkflow, TargetBuildWorkflow, RebuildCheckWorkflow, IrisWatcherWorkflow]
# Slots: monitoring is one long activity per cluster, not one per target, so the slots are taken by short
# steps (submit, watch, log check, capture, validation); 500 keeps hundreds of targets from queueing
# behind each other (temporalio's default is 100). Workflow tasks are short and CPU-bound.
MAX_CONCURRENT_ACTIVITIES = 500
MAX_CONCURRENT_WORKFLOW_TASKS = 200
# The watcher queue (domain/watch.py watcher_task_queue): one workflow and one poll activity per cluster,
# with pollers and slots of their own, so they never wait behind the targets' tasks.
WATCHER_MAX_CONCURRENT = 50
# Polling of the main queue. With temporalio's defaults (5 workflow-task polls, one of them on the normal
# queue; a task waits 10 s on this worker's sticky queue, then moves to the normal queue) 200 targets woken
# within 20 s on a loaded machine each waited out the sticky timeout and then p50 49 s on the normal queue's
# one poll, replayed from their whole history there (bench/monitoring.py, docs/benchmarks.md, issue 37).
# The cost of the longer sticky wait: a task already on a worker that then dies waits up to STICKY_TO_START
# before another worker gets it (the server sends new tasks to the normal queue once the dead worker has not
# polled for 10 s).
WORKFLOW_TASK_POLLS = 16
NONSTICKY_TO_STICKY_POLL_RATIO = 0.25  # 4 of the 16 on the normal queue: new runs and moved tasks
ACTIVITY_TASK_POLLS = 16
STICKY_TO_START = timedelta(seconds=30)


def polling() -> dict:
    """Worker keyword arguments for how the main queue is polled (worker.py and bench/monitor_worker.py)."""
    return dict(workflow_task_poller_behavior=PollerBehaviorSimpleMaximum(maximum=WORKFLOW_TASK_POLLS),
                nonsticky_to_sticky_poll_ratio=NONSTICKY_TO_STICKY_POLL_RATIO,
                activity_task_poller_behavior=PollerBehaviorSimpleMaximum(maximum=ACTIVITY_TASK_POLLS),
                sticky_queue_schedule_to_start_timeout=STICKY_TO_START)


class FlagError(Exception):
    """A flag's value cannot be used (e.g. its port is taken): one line naming the flag, exit 2."""


def _host_port(flag: str, bind: str) -> tuple[str, int]:
    host, sep, port = bind.rpartition(":")
    if not sep or not port.isdigit() or not 0 < int(port) < 65536:
        raise FlagError(f"{flag} {bind}: expected HOST:PORT, e.g. 0.0.0.0:9464")
    return host, int(port)


def _bind_error(flag: str, bind: str, port: int, e: BaseException) -> FlagError:
    if (isinstance(e, OSError) and e.errno == errno.EADDRINUSE) or "in use" in str(e):
        return FlagError(f"{flag} {bind}: port {port} is already in use (another worker on this host?); "
                         f"pass a free port to {flag}")
    return FlagError(f"{flag} {bind}: cannot listen there: {e}")


def serve_metrics(bind: str) -> None:
    """Expose the SDK's Prometheus metrics on ``bind`` (the Temporal runtime owns the listener, so a
    taken port surfaces as its ValueError; turned into one line naming the flag)."""
    from temporalio.runtime import PrometheusConfig, Runtime, TelemetryConfig

    _host, port = _host_port("--metrics", bind)
    try:
        runtime = Runtime(telemetry=TelemetryConfig(metrics=PrometheusConfig(bind_address=bind)))
    except (ValueError, OSError) as e:
        raise _bind_error("--metrics", bind, port, e) from None
    Runtime.set_default(runtime)


def activity_groups(config) -> list:
    return [SourceActivities(config), PreflightActivities(config), BuildActivities(config), RecordActivities(config),
            WatchActivities(config), OperatorActivities(config)]


def activities_for(config, groups: list | None = None) -> list:
    return [a for g in (groups if groups is not None else activity_groups(config)) for a in g.all()]


async def warm_up(groups: list) -> list[str]:
    """Open what the first steps would otherwise open cold: the registry pool validation uses (its
    connection, SSL context and pull token), so the first validation after a start is not the slow one."""
    return [await g.warm_registry() for g in groups if hasattr(g, "warm_registry")]


class Workers:
    """The worker of the main task queue and the one of its watcher queue, entered and shut down together
    (``async with``); ``config()``, ``is_running`` and ``is_shutdown`` are the main worker's (health)."""

    def __init__(self, main: Worker, watcher: Worker):
        self.main, self.watcher = main, watcher

    def config(self) -> dict:
        return self.main.config()

    @property
    def is_running(self) -> bool:
        return self.main.is_running and self.watcher.is_running

    @property
    def is_shutdown(self) -> bool:
        return self.main.is_shutdown or self.watcher.is_shutdown

    async def __aenter__(self) -> Workers:
        await self.main.__aenter__()
        try:
            await self.watcher.__aenter__()
        except BaseException as e:
            await self.main.__aexit__(type(e), e, e.__traceback__)
            raise
        return self

    async def __aexit__(self, exc_type, exc, tb) -> None:
        await asyncio.gather(self.watcher.__aexit__(exc_type, exc, tb), self.main.__aexit__(exc_type, exc, tb))


def build_worker(client, config, *, graceful_shutdown_s: float = 30.0, groups: list | None = None) -> Workers:
    """The main task queue's worker (every workflow and activity: watcher runs started on the main queue
    before it had its own keep running there) and the watcher queue's (the watcher workflow and its poll)."""
    groups = groups if groups is not None else activity_groups(config)
    watch = next(g for g in groups if isinstance(g, WatchActivities))
    identity = f"gpu-rl-builder@{socket.gethostname()}:{os.getpid()}"
    watcher = Worker(
        client,
        task_queue=watcher_task_queue(config.temporal.task_queue),
        workflows=[IrisWatcherWorkflow],
        activities=[watch.watch_cluster],
        graceful_shutdown_timeout=timedelta(seconds=graceful_shutdown_s),
        max_heartbeat_throttle_interval=timedelta(seconds=HEARTBEAT_EVERY_S),
        max_concurrent_activities=WATCHER_MAX_CONCURRENT,
        max_concurrent_workflow_tasks=WATCHER_MAX_CONCURRENT,
        identity=f"{identity}/watcher",
    )
    return Workers(_main_worker(client, config, graceful_shutdown_s=graceful_shutdown_s, groups=groups,
                                identity=identity), watcher)


def _main_worker(client, config, *, graceful_shutdown_s: float, groups: list, identity: str) -> Worker:
    return Worker(
        client,
        task_queue=config.temporal.task_queue,
        workflows=WORKFLOWS,
        activities=activities_for(config, groups),
        graceful_shutdown_timeout=timedelta(seconds=graceful_shutdown_s),
        # Send activity heartbeats as they come (every HEARTBEAT_EVERY_S), not batched up to 80% of the
        # heartbeat timeout: a slow event loop then never looks like a dead worker.
        max_heartbeat_throttle_interval=timedelta(seconds=HEARTBEAT_EVERY_S),
        max_concurrent_activities=MAX_CONCURRENT_ACTIVITIES,
        max_concurrent_workflow_tasks=MAX_CONCURRENT_WORKFLOW_TASKS,
        **polling(),
        identity=identity,
    )


async def run_worker(config_path: str | None, graceful_shutdown_s: float, metrics_bind: str | None,
                     flags: ConnectionFlags | None = None, health_bind: str | None = None) -> None:
    config = resolve_config(load_config(config_path), flags)
    log = get_logger("worker")
    if missing := missing_tools(config):
        raise ConfigError("cannot run this configuration here: " + "; ".join(missing))
    if metrics_bind:
        serve_metrics(metrics_bind)
    probes = _listen_health(health_bind)  # a taken port is refused before connecting
    try:
        client = await connect(config)
    except BaseException:
        if probes:
            probes.close()
        raise
    groups = activity_groups(config)
    worker = build_worker(client, config, graceful_shutdown_s=graceful_shutdown_s, groups=groups)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    log.info("worker started", task_queue=config.temporal.task_queue, temporal=describe(config.temporal))
    # Health outlives the worker so probes keep answering (live, not ready) while it drains.
    async with _health(probes, client, worker, config.temporal.task_queue), _webhooks(client, config), \
            _codec_server(client, config), worker:
        warm = asyncio.create_task(warm_up(groups))  # beside polling: a slow registry never delays the worker
        warm.add_done_callback(lambda t: t.cancelled() or t.exception() or log.info(
            "warmed up", registry="; ".join(t.result())))
        await stop.wait()
        warm.cancel()
        log.info("shutdown requested: draining in-flight activities", grace_s=graceful_shutdown_s)
    log.info("worker stopped")


def _check_tools(config_path: str | None) -> None:
    config = load_config(config_path)
    if missing := missing_tools(config):
        raise ConfigError("; ".join(missing))
    for tool, why in config.required_tools().items():
        click.echo(f"ok {tool} ({why})")


HEALTH_INTERVAL_S = 10.0


def _listen_health(bind: str | None) -> health.HealthServer | None:
    """Listen for /livez, /readyz and /healthz on ``bind`` (probes answer "not ready" until monitored)."""
    if not bind:
        return None
    _host, port = _host_port("--health", bind)
    try:
        return health.HealthServer(health.HealthState(stale_after_s=6 * HEALTH_INTERVAL_S), bind)
    except OSError as e:
        raise _bind_error("--health", bind, port, e) from None


@contextlib.asynccontextmanager
async def _health(server: health.HealthServer | None, client, worker: Worker, task_queue: str,
                  interval_s: float = HEALTH_INTERVAL_S):
    """Keep the probes' state current while the worker runs (see runtime.health)."""
    if server is None:
        yield
        return
    task = asyncio.create_task(health.monitor(server.state, client, task_queue, worker.config()["identity"],
                                              worker, interval_s))
    get_logger("worker").info("health endpoint listening", port=server.port, paths="/livez /readyz /healthz")
    try:
        yield
    finally:
        task.cancel()
        server.close()


@contextlib.asynccontextmanager
async def _webhooks(client, config):
    """The GitHub webhook receiver (``[github.webhook]``), while the worker runs; none when not configured."""
    hook = config.github.webhook if config.github else None
    if hook is None:
        yield None
        return
    secret = fetch_secret(hook.secret, what="github.webhook.secret")  # registered for redaction
    try:
        receiver = webhooks.WebhookReceiver(hook, secret, config.repos.marinskyrl_slug,
                                            webhooks.pipeline_waker(client, config), asyncio.get_running_loop())
    except OSError as e:
        raise _bind_error("github.webhook.listen", hook.listen, int(hook.listen.rpartition(":")[2]), e) from None
    get_logger("worker").info("github webhook receiver listening", port=receiver.port, path=hook.path)
    try:
        yield receiver
    finally:
        receiver.close()


@contextlib.asynccontextmanager
async def _codec_server(client, config):
    """The codec server for the Temporal UI (``[temporal.codec.server]``), while the worker runs."""
    settings = config.temporal.codec.server
    if settings is None:
        yield None
        return
    from activities.merge_gate import github_client
    from runtime.codec_server import CodecApp, CodecServer, github_login_reader, operator_checker

    tokens = [fetch_secret(t, what=f"temporal.codec.server.tokens[{i}]") for i, t in enumerate(settings.tokens)]
    login_of = None
    if settings.github_operators:
        login_of = github_login_reader(config.github.api_url if config.github else "https://api.github.com")
    # Operators by login or by team, as approve-merge decides them (activities.merge_gate.verify_operator).
    app = CodecApp(client.data_converter.payload_codec, config.temporal.namespace, tokens,
                   operators=config.operators, login_of=login_of,
                   operator_of=operator_checker(config.operators, lambda: github_client(config)),
                   max_body_bytes=settings.max_body_bytes)
    host, port = _host_port("temporal.codec.server.listen", settings.listen)
    try:
        server = CodecServer(app, host, port, settings.cors_origins)
    except OSError as e:
        raise _bind_error("temporal.codec.server.listen", settings.listen, port, e) from None
    get_logger("worker").info("codec server listening", port=server.port, paths="/decode /encode")
    try:
        yield server
    finally:
        server.close()


@click.command()
@click.option("--config", "config_path", envvar="GPU_RL_BUILDER_CONFIG", help="Service configuration TOML file.")
@click.option("--graceful-shutdown", default=30.0, show_default=True, help="Seconds in-flight activities get on SIGTERM.")
@click.option("--metrics", "metrics_bind", default=None, help="Expose Prometheus metrics on HOST:PORT.")
@click.option("--health", "health_bind", default=None, metavar="HOST:PORT",
              help="Serve /livez, /readyz (Temporal reachable, pollers seen by the server) and /healthz.")
@click.option("--check-tools", is_flag=True,
              help="Only check that every tool the configuration runs (git, gh, uv, kubectl, ...) is on PATH.")
@click.option("--log-level", default="INFO", show_default=True)
@connection_options
@click.version_option(version(), "--version", prog_name="gpu-rl-builder-worker", message="%(prog)s %(version)s")
def main(config_path, graceful_shutdown, metrics_bind, health_bind, check_tools, log_level, **connection) -> None:
    """Run a gpu-rl-builder worker until SIGTERM/SIGINT, then drain gracefully."""
    configure_logging(log_level)
    try:
        if check_tools:
            _check_tools(config_path)
            return
        asyncio.run(run_worker(config_path, graceful_shutdown, metrics_bind, flags_from(connection), health_bind))
    except (ConfigError, CredentialError, FlagError) as e:  # bad input: named, exit 2, before polling
        click.echo(f"error: {e}", err=True)
        sys.exit(2)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)  # the Temporal runtime can abort a normal interpreter exit (sdk-python#300)


if __name__ == "__main__":
    main()
