"""Plan and submit from the real era-C MarinSkyRL tree; the controller's copy of the job is the check.

The sandbox cannot run the real Dockerfile (no kaniko, no /app): the real script exits 2 at its
"must run inside a disposable Iris task" guard, before installing or pushing anything, and the image
repository is the sandbox registry from configuration, so nothing can reach ghcr.io. What is checked
is that the job the Iris controller received is the one planned from the real files: resources,
timeout and priority from the ops doc's resource line, the script's credential names, the real
script run from the bundle (it needs the files beside it; the ops doc's template is stale). The pipeline and job are then ended.
"""

from __future__ import annotations

import contextlib

import pytest

from clients.iris import IrisClient, IrisError
from tests.cli.test_cli_plan import _terminate_running
from tests.e2e.helpers import report, request, start_pipeline, target_status, wait_until
from tests.real_tree_stack import real_tree_service

pytestmark = pytest.mark.stack


async def test_real_era_c_tree_submits_the_job_it_planned(service_config, request_id):
    async with real_tree_service(service_config, "era-c", request_id) as s:
        handle = await start_pipeline(s, request(archs=("amd64",), variants=("standard",)))
        revision = s.config.clusters["sandbox-amd64"].client_revision_date
        job_id = None
        try:
            async def submitted():
                st = await target_status(s.client, handle.id, "amd64-standard")
                return st.job_ids[0] if st and st.job_ids else None

            job_id = await wait_until(submitted, timeout=240, what="the amd64-standard job")
            planned = next(t for t in (await report(s.client, handle.id)).plan if t.key == "amd64-standard")
            async with IrisClient(s.iris.url, client_revision_date=revision) as iris:
                echoed = (await iris._call("GetJobStatus", {"jobId": job_id}))["request"]

                async def guard_line():
                    page = await iris.fetch_logs(f"{job_id}/", substring="disposable Iris task")
                    return next((e.data for e in page.entries), None)

                guard = await wait_until(guard_line, timeout=120, what="the real script's first output")
        finally:
            with contextlib.suppress(Exception):
                await handle.terminate(reason="test: spec read back")
            await _terminate_running(s.client, s.task_queue)
            if job_id:
                async with IrisClient(s.iris.url, client_revision_date=revision) as iris:
                    with contextlib.suppress(IrisError):
                        await iris.terminate(job_id)

    # Values read from era-c/.agents/ops/gpu-rl-image-build.md line 25 and the -e block (lines 77-82).
    res = echoed["resources"]
    assert (res["cpuMillicores"], res["memoryBytes"], res["diskBytes"]) == (48000, str(512 * 2**30), str(400 * 2**30))
    assert echoed["timeout"]["milliseconds"] == str(18000 * 1000)
    assert echoed.get("maxRetriesFailure", 0) == 0
    assert echoed["priorityBand"] == "PRIORITY_BAND_INTERACTIVE"
    assert echoed["taskImage"] == "docker.io/library/ubuntu:22.04"
    # The script finds write_registry_auth.sh beside itself: the job runs the bundle's copy (#18), not a
    # decoded one in /tmp as the ops doc's stale template said.
    assert echoed["entrypoint"]["runCommand"]["argv"] == [
        "bash", "-lc", 'exec bash "${IRIS_WORKDIR:-/app}/docker/build_gpu_rl_kaniko.sh"']
    env = echoed["environment"]["envVars"]
    names = set(env)
    assert {"GITSHA", "REGISTRY_USER", "REGISTRY_TOKEN", "WHEEL_SOURCE", "IMAGE_REPOSITORY"} <= names
    assert "BUILD_B64" not in names
    assert not {"DOCKER_USER_ID", "GHCR_TOKEN"} & names, "the script's credential names, not the stale prose"
    assert env["WHEEL_SOURCE"] == "wheel-builder"
    host = s.config.registry.image_repository.split(":")[0]  # the echo redacts what follows the host
    assert env["IMAGE_REPOSITORY"].startswith(f"{host}:") and "ghcr.io" not in env["IMAGE_REPOSITORY"]
    # The controller redacts secret-looking values (token, sha, script) in its echo; the task's own log
    # shows that the real era-C script ran and stopped at its guard (line 65) before doing anything.
    assert guard and "must run inside a disposable Iris task" in guard
    # The job the controller holds is the planned one, field by field.
    assert planned.job.resources.cpu * 1000 == res["cpuMillicores"] and planned.job.timeout_s == 18000
    assert planned.provenance["resources.cpu"] == ".agents/ops/gpu-rl-image-build.md:25"
    assert planned.job.job_name in job_id


@pytest.fixture
def request_id(request) -> str:
    return request.node.nodeid
