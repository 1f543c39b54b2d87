"""Fixtures of the workflow tests."""

from __future__ import annotations

import pytest_asyncio
from temporalio.api.enums.v1 import IndexedValueType
from temporalio.api.operatorservice.v1 import AddSearchAttributesRequest
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.testing import WorkflowEnvironment

from sandbox.temporal_server import SEARCH_ATTRIBUTES
from tests.histories.generate import test_server_path


@pytest_asyncio.fixture
async def own_time_skipping_env():
    """A private time-skipping server for tests whose workflow cancels an in-flight activity (merge authorization
    cancelling a watch, a cancelled build):
    the Java test server keeps its clock locked after that (observed: later timer tests stall), so
    such tests must not share the session server."""
    env = await WorkflowEnvironment.start_time_skipping(data_converter=pydantic_data_converter,
                                                        test_server_existing_path=test_server_path())
    await env.client.operator_service.add_search_attributes(AddSearchAttributesRequest(
        namespace=env.client.namespace,
        search_attributes={n: IndexedValueType.INDEXED_VALUE_TYPE_KEYWORD
                           for n, kind in SEARCH_ATTRIBUTES.items() if kind == "Keyword"}))
    yield env
    await env.shutdown()
