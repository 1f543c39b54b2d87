"""Logs complete before judging (issue #17), on the real 0.2.227 controller.

What produces the lag there: a task's output is streamed into the worker's finelog client, which
buffers it and flushes every second; the attempt turns terminal before the last flush lands. A task
that prints a large final burst (here 5 000 lines, then kaniko's push lines) and exits at once makes
the tail arrive after the terminal state in most runs (measured 5 of 6, up to 1.7 s late). The
activity's judgment (``check_build_log``) must see the final push anyway, every time; a failing job's
evidence must hold its failing lines."""

from __future__ import annotations

import asyncio
import datetime
import json
import uuid
from pathlib import Path

import pytest
from temporalio.testing import ActivityEnvironment

from activities.build import BuildActivities
from domain.config import ServiceConfig
from domain.markers import DIGEST_RE, Marker, check_log
from domain.models import CaptureInput, LogCheckInput
from tests.iris.helpers import SMALL, bash_spec
from tests.workflows.standins import target_input

pytestmark = pytest.mark.stack

REPO, TAG = "registry.local/gpu-rl", "lag-test"
DIGEST = "ab" * 32
BURST = 5_000
# Final bursts of the lag test, alternating: 5,000 lines lagged in 5 of 6 runs on a loaded machine and in 0
# of 40 on an idle one (CI, 2026-12-04); 20,000 in 3-6 of 6 and 50,000 in 6 of 6 there, so every run meets
# the situation it checks, whatever the machine's load.
LAG_BURSTS = (BURST, 50_000)
# Six runs, three of each burst (12 before: the same two runs repeated six times, ~80 s of the suite's
# tail on 2 cores); the loop still goes on until one run really lagged.
RUNS = 6


def _config(tmp_path: Path, url: str) -> ServiceConfig:
    return ServiceConfig.model_validate({
        "work_dir": str(tmp_path),
        "repos": {"marinskyrl_url": "file:///nowhere", "harbor_url": "file:///nowhere"},
        "clusters": {"local": {"controller_url": url, "iris_user": "tester",
                               "client_revision_date": datetime.date.today().isoformat()}},
        "registry": {"image_repository": REPO, "user": {"kind": "literal_public", "value": "u"},
                     "token": {"kind": "env", "name": "NO_SUCH_X"}},
    })


def _markers() -> list[Marker]:
    import re

    return [Marker(name=f"push {REPO}:{TAG}", text=f"Pushing image to {REPO}:{TAG}", source="kaniko", role="push"),
            Marker(name=f"pushed {REPO}@sha256", pattern=re.escape(f"Pushed {REPO}@") + DIGEST_RE,
                   source="kaniko", role="pushed")]


async def _terminal_then_first_read(iris, name: str, burst: int = BURST) -> str:
    """Wait for the terminal state as a watcher sees it, then read the log once, at once (the old way)."""
    for _ in range(2400):  # bounded: 2 minutes
        state = (await iris.job_states([name])).get(name)
        if state and state.is_terminal:
            break
        await asyncio.sleep(0.05)
    page = await iris.fetch_logs(f"{name}/", max_lines=burst + 100)
    return "".join(f"{line}\n" for line in page.lines)


async def test_push_marker_flushed_after_terminal_is_judged_validated_every_time(iris_controller, iris_client,
                                                                                tmp_path):
    acts = BuildActivities(_config(tmp_path, iris_controller.url))
    target = target_input("lag").target.model_copy(update={"expected_markers": _markers()})
    late = runs = 0
    while runs < RUNS or (not late and runs < 4 * RUNS):  # 6 in a row, and until one really lagged
        burst = LAG_BURSTS[runs % len(LAG_BURSTS)]
        runs += 1
        script = (f"seq 1 {burst}; echo 'INFO Pushing image to {REPO}:{TAG}'; "
                  f"echo 'INFO Pushed {REPO}@sha256:{DIGEST}'")
        name = f"/tester/lag-{uuid.uuid4().hex[:8]}"
        await iris_client.launch_job(bash_spec(name, script))
        first = await _terminal_then_first_read(iris_client, name, burst)
        if not check_log(_markers(), first).final_push_seen:
            late += 1  # a single read at terminal would have failed this good build
        check = await ActivityEnvironment().run(
            acts.check_build_log, LogCheckInput(request_id="lag", job_id=name, cluster="local", target=target))
        assert (check.final_push_seen, check.missing, check.pushed_digest) == (True, [], f"sha256:{DIGEST}"), runs
    # The situation under test really happened (else this test could not fail).
    assert late >= 1, f"no run of {runs} had its push line arrive after the terminal state"
    print(f"log lag: {late} of {runs} push lines arrived after the terminal state; all {runs} judged validated")


async def test_failing_job_evidence_holds_its_failing_lines(iris_controller, iris_client, tmp_path):
    acts = BuildActivities(_config(tmp_path, iris_controller.url))
    name = f"/tester/lagfail-{uuid.uuid4().hex[:8]}"
    cause = "error: failed to solve: pip install megatron-core==0.99: no matching distribution"
    await iris_client.launch_job(bash_spec(
        name, f"seq 1 {BURST}; echo '{cause}' >&2; "
              "echo 'error building image: error building stage: failed to execute command: exit status 3' >&2; exit 3",
        resources=SMALL))
    await _terminal_then_first_read(iris_client, name)
    captured = await ActivityEnvironment().run(
        acts.capture_failure, CaptureInput(request_id="lag", job_id=name, cluster="local", target_key="amd64-standard"))
    log = Path(captured.log.uri.removeprefix("file://")).read_text()
    assert cause in log and "exit status 3" in log and f"] {BURST}\n" in log
    diag = json.loads(Path(captured.diagnostics.uri.removeprefix("file://")).read_text())
    assert diag["log_complete"] is True
    assert captured.failing_line == diag["failing_line"] == cause  # the line above kaniko's wrapper
