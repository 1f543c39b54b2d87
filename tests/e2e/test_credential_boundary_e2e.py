"""No credential leaves its boundary, on the real stack (issue #21 items 1 and 2): a tracked symlink to a
worker secret, and a build script that would send the registry token to another host, are refused before
anything is pushed, submitted or opened; the "other host" is a recording server that sees 0 requests."""

from __future__ import annotations

import os
import socket
import subprocess
import threading

import httpx
import pytest
from temporalio.client import WorkflowFailureError

from clients.iris import IrisClient
from sandbox.git_remotes import _commit_via_clone, commit_to_remote
from sandbox.stack import MARINSKYRL_SLUG
from tests.e2e.helpers import git_show, request, start_pipeline

pytestmark = pytest.mark.stack
SCRIPT = "docker/build_gpu_rl_kaniko.sh"


class RecordingHost:
    """A TCP listener on loopback standing for another registry host: it counts every connection."""

    def __init__(self):
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.sock.settimeout(0.2)
        self.host = f"127.0.0.1:{self.sock.getsockname()[1]}"
        self.connections = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def _serve(self):
        while not self._stop.is_set():
            try:
                conn, _ = self.sock.accept()
            except TimeoutError:
                continue
            self.connections += 1
            conn.close()

    def close(self):
        self._stop.set()
        self._thread.join(5)
        self.sock.close()


@pytest.fixture
def other_host():
    h = RecordingHost()
    yield h
    h.close()


async def _nothing_left_behind(s, base_commit: str) -> None:
    heads = subprocess.run(["git", "ls-remote", "--heads", s.remotes.marinskyrl_url],
                           capture_output=True, text=True, check=True).stdout
    assert "gpu-rl-build/" not in heads, heads  # no build branch pushed
    async with IrisClient(s.iris.url, client_revision_date=s.config.clusters["sandbox-amd64"].client_revision_date) as iris:
        jobs = await iris.list_jobs(prefix="/gpu-rl-builder/gpurl-kaniko-")
    assert not [j.job_id for j in jobs if f"-{base_commit[:8]}-" in j.job_id]  # nothing submitted
    async with httpx.AsyncClient(base_url=s.github.api_url, headers={"Authorization": f"Bearer {s.github.token}"}) as gh:
        pulls = (await gh.get(f"/repos/{MARINSKYRL_SLUG}/pulls", params={"state": "all"})).json()
    assert pulls == []  # no PR opened


async def test_a_tracked_symlink_to_a_worker_secret_is_refused_before_anything_is_pushed(service_stack):
    s = service_stack
    secret_file = s.state_dir / "secrets" / "github-token"
    assert secret_file.read_text().strip() == s.github.token

    def link(work):
        os.symlink(secret_file, work / "skyrl-train" / "NOTES.txt")

    head = _commit_via_clone(s.remotes.marinskyrl_url, "notes", "main", link)
    handle = await start_pipeline(s, request())
    with pytest.raises(WorkflowFailureError) as failed:
        await handle.result()
    message = str(failed.value.cause)
    assert "skyrl-train/NOTES.txt: symlink to" in message and "regular files of the repository only" in message
    await _nothing_left_behind(s, head)
    assert s.github.token not in message


async def test_a_cache_repository_on_another_host_refuses_the_plan_and_that_host_sees_nothing(service_stack,
                                                                                              other_host):
    s = service_stack
    script = git_show(s.remotes.marinskyrl_url, "main", SCRIPT)
    leaky = script.replace("${KANIKO_CACHE_REPOSITORY:-$REPO/$CACHE_NAME}",
                           f"${{KANIKO_CACHE_REPOSITORY:-{other_host.host}/cache}}")
    assert leaky != script
    head = commit_to_remote(s.remotes.marinskyrl_url, {SCRIPT: leaky}, "cache layers elsewhere")
    handle = await start_pipeline(s, request())
    with pytest.raises(WorkflowFailureError) as failed:
        await handle.result()
    message = str(failed.value.cause)
    assert f"{SCRIPT}:" in message and f"cache repository {other_host.host}/cache is on {other_host.host}" in message
    assert f"bound to {s.token_registry.host}" in message
    await _nothing_left_behind(s, head)
    assert other_host.connections == 0


async def test_a_script_default_on_another_host_decides_nothing(service_stack, other_host):
    """registry.image_repository is required: the repository's default is never where the token goes."""
    s = service_stack
    script = git_show(s.remotes.marinskyrl_url, "main", SCRIPT)
    moved = script.replace("ghcr.io/marin-community/marinskyrl", f"{other_host.host}/marinskyrl")
    assert moved != script
    commit_to_remote(s.remotes.marinskyrl_url, {SCRIPT: moved}, "default repository elsewhere")
    handle = await start_pipeline(s, request(), plan_only=True)
    rep = await handle.result()
    assert rep.status == "planned"
    assert {t.image_repository for t in rep.plan} == {s.config.registry.image_repository}
    assert other_host.connections == 0
