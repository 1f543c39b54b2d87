"""An unreachable controller is never a terminal state: monitor_job reports it and keeps the job open."""

from __future__ import annotations

import socket

from temporalio.testing import ActivityEnvironment

from activities.build import BuildActivities
from domain.config import ServiceConfig
from domain.models import MonitorInput


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


async def test_unreachable_controller_is_reported_not_terminal(tmp_path):
    config = ServiceConfig.model_validate({
        "work_dir": str(tmp_path),
        "repos": {"marinskyrl_url": "file:///nowhere", "harbor_url": "file:///nowhere"},
        "clusters": {"c": {"controller_url": f"http://127.0.0.1:{_closed_port()}",
                           "client_revision_date": "2026-11-20"}},
        "registry": {"image_repository": "127.0.0.1:5000/gpu-rl", "user": {"kind": "literal_public", "value": "u"}, "token": {"kind": "env", "name": "X"}},
        "policy": {"poll_min_interval_s": 0.1, "poll_max_interval_s": 0.2},
    })
    beats: list = []
    env = ActivityEnvironment()
    env.on_heartbeat = lambda *d: beats.append(d)
    progress = await env.run(BuildActivities(config).monitor_job,
                             MonitorInput(job_id="/u/build", cluster="c", return_after_s=0.5, log_cursor=9))
    assert not progress.terminal and not progress.controller_reachable and not progress.missing
    assert progress.log_cursor == 9 and "unreachable" in progress.error
    assert beats and beats[-1][0]["controller_reachable"] is False
