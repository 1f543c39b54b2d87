"""The whole service on real parts: one session's Temporal dev server, Iris controller and registries,
plus per-test git remotes, a GitHub stand-in and an in-process worker on its own task queue.

Each test gets remotes whose MarinSkyRL head is unique to it (a marker commit), so workflow ids —
derived from (source commit, Harbor commit) — never collide between tests sharing the server.
"""

from __future__ import annotations

import re
import uuid
from dataclasses import dataclass
from pathlib import Path

import pytest_asyncio
from temporalio.client import Client
from temporalio.contrib.pydantic import pydantic_data_converter

from domain.config import ServiceConfig, load_config
from sandbox.git_remotes import SeededRemotes, commit_to_remote
from sandbox.github_standin import start_github_standin
from sandbox.stack import HARBOR_SLUG, IMAGE_REPO_PATH, MARINSKYRL_SLUG, write_service_config
from tests.fixtures_git import fresh_remotes
from worker import build_worker


@dataclass
class ServiceStack:
    config: ServiceConfig
    config_path: Path
    client: Client
    remotes: SeededRemotes
    github: object
    token_registry: object
    iris: object
    temporal: object
    state_dir: Path

    @property
    def task_queue(self) -> str:
        return self.config.temporal.task_queue

    @property
    def image_repo_path(self) -> str:
        return IMAGE_REPO_PATH


# The PR watch re-reads GitHub every 0.5 s (sandbox: 5 s, 2 s once authorized): a test that turns a
# check green or approves waits for the next read, and no test here counts the watch's reads.
TEST_POLICY = {"merge_watch_interval_s": 0.5, "merge_watch_authorized_interval_s": 0.5}


@pytest_asyncio.fixture
async def service_config(request, tmp_path, temporal_dev_server, iris_controller, token_registry, open_registry):
    """Everything but the worker: config, remotes, GitHub stand-in, a connected client."""
    remotes = fresh_remotes(tmp_path / "remotes")
    remotes.marinskyrl_head = commit_to_remote(
        remotes.marinskyrl_url, {"tests/nodeid.txt": request.node.nodeid + "\n"}, f"test: {request.node.name}")
    github = start_github_standin(tmp_path / "github", {
        MARINSKYRL_SLUG: remotes.marinskyrl_url.removeprefix("file://"),
        HARBOR_SLUG: remotes.harbor_url.removeprefix("file://")})
    token_registry.set_public(IMAGE_REPO_PATH, False)
    queue = "q-" + re.sub(r"[^a-z0-9]+", "-", request.node.name.lower())[:40] + "-" + uuid.uuid4().hex[:6]
    path = write_service_config(tmp_path / "config.toml", tmp_path, temporal=temporal_dev_server, iris=iris_controller,
                                token_registry=token_registry, open_registry=open_registry, remotes=remotes,
                                github=github, task_queue=queue, policy=TEST_POLICY)
    config = load_config(path)
    client = await Client.connect(temporal_dev_server.address, namespace=temporal_dev_server.namespace,
                                  data_converter=pydantic_data_converter)
    try:
        yield ServiceStack(config=config, config_path=path, client=client, remotes=remotes, github=github,
                           token_registry=token_registry, iris=iris_controller, temporal=temporal_dev_server,
                           state_dir=tmp_path)
    finally:
        github.stop()
        token_registry.set_public(IMAGE_REPO_PATH, False)


@pytest_asyncio.fixture
async def service_stack(service_config):
    """The service with an in-process worker on the test's own task queue."""
    worker = build_worker(service_config.client, service_config.config, graceful_shutdown_s=5)
    async with worker:
        yield service_config
