"""``schedule list`` shows a created schedule and its paused state (creation plans the request once on the
stack's worker, nothing submitted)."""

from __future__ import annotations

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
            return next((line for line in ran.out.splitlines() if line.split("\t")[0] == sid), None)

        assert await wait_until(listed, what="schedule listed", timeout=30) == f"{sid}\tpaused=False"
        assert (await starter(cfg, "schedule", "pause", sid)).code == 0
        assert await wait_until(lambda: _line_is(listed, f"{sid}\tpaused=True"), what="paused listed", timeout=30)
    finally:
        await starter(cfg, "schedule", "delete", sid)


async def _line_is(listed, expected: str) -> bool:
    return await listed() == expected
