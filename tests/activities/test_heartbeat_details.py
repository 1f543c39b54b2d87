"""A background heartbeat repeats what the activity last reported instead of overwriting it with nothing.

Every activity runs inside a background Heartbeater (activities/common.py ``_heartbeating``); before this,
its beat sent ``None`` every couple of seconds, so a pending PR watch or monitor showed empty details in
``describe`` and the Temporal UI most of the time although the activity had just reported its state."""

from __future__ import annotations

import asyncio

from temporalio.testing import ActivityEnvironment

from activities.common import Heartbeater, _heartbeating, heartbeat


async def test_the_background_beat_repeats_the_details_the_activity_reported():
    seen: list[object] = []

    async def watch() -> None:
        async with Heartbeater(every_s=0.05):  # a nested one, as the PR watch has
            heartbeat({"pr": 7, "state": "checks pending"})
            await asyncio.sleep(0.3)
        await asyncio.sleep(0.2)  # only the outer, per-activity beat runs now

    env = ActivityEnvironment()
    env.on_heartbeat = lambda *details: seen.append(details[0] if details else None)
    import activities.common as common
    every, common.HEARTBEAT_EVERY_S = common.HEARTBEAT_EVERY_S, 0.05
    try:
        await env.run(_heartbeating(watch))
    finally:
        common.HEARTBEAT_EVERY_S = every
    after = seen[seen.index({"pr": 7, "state": "checks pending"}):]
    assert len(after) >= 6, seen
    assert all(d == {"pr": 7, "state": "checks pending"} for d in after), seen


async def test_details_set_on_a_heartbeater_are_what_heartbeat_later_replaces():
    seen: list[object] = []

    async def step() -> None:
        async with Heartbeater(every_s=0.05) as beat:
            beat.details = {"polls": 1}
            await asyncio.sleep(0.15)
            heartbeat({"polls": 2})
            await asyncio.sleep(0.15)

    env = ActivityEnvironment()
    env.on_heartbeat = lambda *details: seen.append(details[0] if details else None)
    await env.run(step)
    assert {"polls": 1} in seen and seen[-1] == {"polls": 2}, seen
    assert None not in seen[seen.index({"polls": 1}):], seen
