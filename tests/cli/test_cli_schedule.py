"""``schedule list`` shows a created schedule and its paused state in its table (creation plans the request
once on the stack's worker, nothing submitted). The table's other columns: test_cli_tables.py."""

from __future__ import annotations

import re
import uuid

import pytest

from tests.cli.starter_cli import starter
from tests.e2e.helpers import wait_until

pytestmark = pytest.mark.stack



async def test_schedule_list_shows_created_and_paused_schedules(service_stack):
    cfg = service_stack.config_path
    sid = f"cli-list-{uuid.uuid4().hex[:8]}"
    created = await starter(cfg, "schedule", "create", sid, "--cron", "0 2 * * *", "--arch", "amd64",
                            "--cluster", "amd64=sandbox-amd64",
                            "--requested-by", "tester", "--reason", "list test")
    assert created.code == 0, created.text
    try:
        async def listed():
            ran = await starter(cfg, "schedule", "list")
            assert ran.code == 0, ran.text
            return next((re.split(r"\s{2,}", line) for line in ran.out.splitlines() if line.startswith(sid + " ")),
                        None)

        row = await wait_until(listed, what="schedule listed", timeout=30)
        assert row[:3] == [sid, "active", "cron '0 2 * * *' (UTC)"], row
        assert (await starter(cfg, "schedule", "pause", sid)).code == 0
        assert await wait_until(lambda: _state_is(listed, "paused"), what="paused listed", timeout=30)
    finally:
        await starter(cfg, "schedule", "delete", sid)


async def _state_is(listed, expected: str) -> bool:
    row = await listed()
    return bool(row) and row[1] == expected
