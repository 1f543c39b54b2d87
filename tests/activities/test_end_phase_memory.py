"""200 targets ending together must not hold 200 whole logs in one worker (issue 37 item 3): a 3,000-line log is
~7 MiB while it is judged, and bench/end_phase.py measured a worker at 990 MiB RSS with every end phase reading
at once. ``check_build_log`` holds a log only inside one of ``LOG_SLOTS`` slots of its worker; the others wait
(heartbeating) for a slot."""

from __future__ import annotations

import asyncio
import datetime
import re
from pathlib import Path

from temporalio.testing import ActivityEnvironment

import activities.build as build
from activities.build import BuildActivities
from activities.log_reads import LOG_SLOTS
from clients.iris import CompleteLog, LogEntry
from domain.config import ServiceConfig
from domain.markers import DIGEST_RE, Marker
from domain.models import LogCheckInput
from tests.workflows.standins import target_input

PUSH = "Pushing image to 127.0.0.1:9/evidence:t1"
PUSHED = "Pushed 127.0.0.1:9/evidence@sha256:" + "a" * 64


def _config(tmp_path: Path) -> ServiceConfig:
    return ServiceConfig.model_validate({
        "work_dir": str(tmp_path / "work"),
        "repos": {"marinskyrl_url": "file:///nowhere", "harbor_url": "file:///nowhere"},
        "clusters": {"local": {"controller_url": "http://127.0.0.1:9", "iris_user": "tester",
                               "client_revision_date": datetime.date.today().isoformat()}},
        "registry": {"image_repository": "127.0.0.1:9/evidence", "insecure_hosts": ["127.0.0.1:9"],
                     "user": {"kind": "literal_public", "value": "u"}, "token": {"kind": "env", "name": "NO_SUCH_X"}},
    })


async def test_end_phases_ending_together_hold_at_most_log_slots_logs(tmp_path, monkeypatch):
    acts = BuildActivities(_config(tmp_path))
    target = target_input("slots").target.model_copy(update={
        "expected_markers": [Marker(name="push", text=PUSH, source="kaniko", role="push"),
                             Marker(name="pushed", pattern=re.escape("Pushed 127.0.0.1:9/evidence@") + DIGEST_RE,
                                    source="kaniko", role="pushed")],
        "image_repository": "127.0.0.1:9/evidence", "tag": "t1"})
    reading, most = 0, 0

    async def log_of(iris, job_id: str, start=None) -> CompleteLog:  # the store read, without a controller
        nonlocal reading, most
        reading += 1
        most = max(most, reading)
        await asyncio.sleep(0.05)
        reading -= 1
        return CompleteLog(entries=[LogEntry(ts_ms=1, key=f"{job_id}/0:0", data=PUSH, seq=1),
                                    LogEntry(ts_ms=2, key=f"{job_id}/0:0", data=PUSHED, seq=2)], cursor=2,
                           complete=True, reads=1)
    monkeypatch.setattr(build, "_complete_log", log_of)

    n = 3 * LOG_SLOTS
    inputs = [LogCheckInput(request_id="slots", job_id=f"/tester/slots-{i:03d}", cluster="local", target=target,
                            build_commit="1" * 40, harbor_commit="2" * 40) for i in range(n)]
    checks = await asyncio.gather(*(ActivityEnvironment().run(acts.check_build_log, i) for i in inputs))
    assert all(c.final_push_seen and not c.missing for c in checks)  # every end phase judged its log
    assert most == LOG_SLOTS, most  # never more logs at once than the slots (all 48 before)
    assert acts.log_reads.most_held == LOG_SLOTS and acts.log_reads.waiting == 0
