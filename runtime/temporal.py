"""Connect to Temporal the same way from the worker, the starter and the tests."""

from __future__ import annotations

from temporalio.client import Client
from temporalio.contrib.pydantic import pydantic_data_converter

from clients.credentials import fetch_secret
from domain.config import ServiceConfig


async def connect(config: ServiceConfig) -> Client:
    t = config.temporal
    api_key = fetch_secret(t.api_key, what="temporal.api_key") if t.api_key else None
    return await Client.connect(
        t.address,
        namespace=t.namespace,
        api_key=api_key,
        tls=t.tls,
        data_converter=pydantic_data_converter,
    )


def workflow_ui_url(config: ServiceConfig, workflow_id: str) -> str | None:
    if not config.temporal.ui_url:
        return None
    base = config.temporal.ui_url.rstrip("/")
    return f"{base}/namespaces/{config.temporal.namespace}/workflows/{workflow_id}"
