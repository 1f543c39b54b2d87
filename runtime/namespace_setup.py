"""Prepare a Temporal namespace for gpu-rl-builder: the search attributes operators filter on
(``runtime.search_attributes``) and the retention of closed builds. Idempotent: run it on every deploy.

  gpu-rl-builder-setup-namespace --address temporal-frontend:7233 --namespace gpu-rl-builds --create
  gpu-rl-builder-setup-namespace --profile cloud --retention-days 30      # Temporal Cloud

Why the SDK's own services: the same connection options as the worker and the starter (profiles,
TEMPORAL_*, mTLS, API key), and no ``temporal`` CLI needed in the worker image. On Temporal Cloud the
namespace is created (and, with API keys lacking the admin role, configured) with ``tcld``; when the
server refuses, the equivalent ``tcld`` commands are printed.
"""

from __future__ import annotations

import asyncio
import os
import sys
from datetime import timedelta

import click
from google.protobuf.duration_pb2 import Duration
from temporalio.api.enums.v1 import IndexedValueType
from temporalio.api.namespace.v1 import NamespaceConfig
from temporalio.api.operatorservice.v1 import AddSearchAttributesRequest, ListSearchAttributesRequest
from temporalio.api.workflowservice.v1 import (
    DescribeNamespaceRequest,
    RegisterNamespaceRequest,
    UpdateNamespaceRequest,
)
from temporalio.service import RPCError, RPCStatusCode

from clients.credentials import CredentialError
from domain.config import ConfigError, TemporalSettings, load_config
from runtime import search_attributes
from runtime.temporal import connect_kwargs, connection_options, describe, flags_from, resolve_settings


class SetupError(RuntimeError):
    """The namespace cannot be prepared; the message says what to do instead."""


def _tcld_hint(namespace: str, retention_days: int) -> str:
    lines = [f"tcld namespace retention set --namespace {namespace} --retention-days {retention_days}"]
    lines += [f"tcld namespace search-attributes add --namespace {namespace} --search-attribute '{k.name}=Keyword'"
              for k in search_attributes.ALL]
    return "\n  ".join(lines)


async def setup_namespace(client, namespace: str, retention_days: int, create: bool) -> list[str]:
    """Create (if asked), set retention, add missing search attributes; returns what was done."""
    done: list[str] = []
    retention = Duration()
    retention.FromTimedelta(timedelta(days=retention_days))
    try:
        described = await client.workflow_service.describe_namespace(DescribeNamespaceRequest(namespace=namespace))
        current = described.config.workflow_execution_retention_ttl.ToTimedelta()
    except RPCError as e:
        if e.status != RPCStatusCode.NOT_FOUND:
            raise
        if not create:
            raise SetupError(f"namespace {namespace!r} does not exist: pass --create (team server) or create it "
                             f"in Temporal Cloud (tcld namespace create / the Cloud UI)") from None
        await client.workflow_service.register_namespace(RegisterNamespaceRequest(
            namespace=namespace, workflow_execution_retention_period=retention,
            description="gpu-rl-builder: durable GPU-RL image builds"))
        done.append(f"created namespace {namespace} (retention {retention_days} d)")
        current = timedelta(days=retention_days)
        await _until_known(client, namespace)
    if current != timedelta(days=retention_days):
        await client.workflow_service.update_namespace(UpdateNamespaceRequest(
            namespace=namespace, config=NamespaceConfig(workflow_execution_retention_ttl=retention)))
        done.append(f"retention {current} -> {retention_days} d")
    existing = (await client.operator_service.list_search_attributes(
        ListSearchAttributesRequest(namespace=namespace))).custom_attributes
    missing = {}
    for key in search_attributes.ALL:
        wanted = IndexedValueType.Value(f"INDEXED_VALUE_TYPE_{key.indexed_value_type.name}")
        if key.name not in existing:
            missing[key.name] = wanted
        elif existing[key.name] != wanted:
            raise SetupError(f"search attribute {key.name} exists with type "
                             f"{IndexedValueType.Name(existing[key.name])}, expected {IndexedValueType.Name(wanted)}")
    if missing:
        await client.operator_service.add_search_attributes(
            AddSearchAttributesRequest(namespace=namespace, search_attributes=missing))
        done.append("added search attributes " + ", ".join(sorted(missing)))
    return done


async def _until_known(client, namespace: str, timeout_s: float = 60.0) -> None:
    """A new namespace reaches every server role's cache after a few seconds; wait (bounded) for it."""
    deadline = asyncio.get_running_loop().time() + timeout_s
    while True:
        try:
            await client.operator_service.list_search_attributes(ListSearchAttributesRequest(namespace=namespace))
            return
        except RPCError as e:
            if e.status != RPCStatusCode.NOT_FOUND or asyncio.get_running_loop().time() > deadline:
                raise
        await asyncio.sleep(1.0)


@click.command()
@click.option("--config", "config_path", envvar="GPU_RL_BUILDER_CONFIG",
              help="Service configuration TOML (its [temporal] section); optional.")
@click.option("--retention-days", default=30, show_default=True, type=click.IntRange(1, 3650),
              help="How long closed builds (history, report, evidence links) stay visible.")
@click.option("--create", is_flag=True, help="Create the namespace when it is missing (team server only).")
@connection_options
def main(config_path, retention_days, create, **connection) -> None:
    """Create/prepare the Temporal namespace: search attributes and retention (idempotent)."""
    from temporalio.client import Client

    try:
        base = load_config(config_path).temporal if config_path else TemporalSettings()
        settings = resolve_settings(base, flags_from(connection))
        kwargs = connect_kwargs(settings)
    except (ConfigError, CredentialError) as e:
        click.echo(f"error: {e}", err=True)
        sys.exit(2)

    async def go() -> list[str]:
        client = await Client.connect(**kwargs)
        return await setup_namespace(client, settings.namespace, retention_days, create)

    code = 0
    try:
        done = asyncio.run(go())
        click.echo(f"namespace {settings.namespace} ready: " + ("; ".join(done) if done else "nothing to change"))
    except SetupError as e:
        click.echo(f"error: {e}", err=True)
        code = 1
    except RPCError as e:
        if e.status in (RPCStatusCode.PERMISSION_DENIED, RPCStatusCode.UNIMPLEMENTED):
            click.echo(f"error: {describe(settings)} refused ({e.message}). On Temporal Cloud run:\n  "
                       + _tcld_hint(settings.namespace, retention_days), err=True)
            code = 1
        else:
            click.echo(f"error: {describe(settings)}: {e.message}", err=True)
            code = 3
    except RuntimeError as e:  # connection failures
        click.echo(f"error: cannot reach Temporal at {describe(settings)}: {e}", err=True)
        code = 3
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)  # the Temporal runtime can abort a normal interpreter exit (sdk-python#300)

if __name__ == "__main__":
    main()
