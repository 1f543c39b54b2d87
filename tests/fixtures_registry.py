"""Session fixtures: one real local docker-registry per auth mode, started once per test session.

``open_registry`` (anonymous push/pull), ``htpasswd_registry`` (Basic), ``token_registry`` (ghcr-like
token server, with the fault-injecting proxy in front: ``.inject(429, 2, retry_after=1)``). Handles come
from ``sandbox.registry.start_registry``; ``.credentials`` is the push user's (user, token).
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from sandbox.registry import RegistryHandle, start_registry


def _started(tmp_path_factory: pytest.TempPathFactory, mode: str, **kw: object) -> Iterator[RegistryHandle]:
    handle = start_registry(tmp_path_factory.mktemp(f"registry-{mode}"), mode, **kw)  # type: ignore[arg-type]
    try:
        yield handle
    finally:
        handle.stop()


@pytest.fixture(scope="session")
def open_registry(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RegistryHandle]:
    yield from _started(tmp_path_factory, "open")


@pytest.fixture(scope="session")
def htpasswd_registry(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RegistryHandle]:
    yield from _started(tmp_path_factory, "htpasswd")


@pytest.fixture(scope="session")
def token_registry(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RegistryHandle]:
    yield from _started(tmp_path_factory, "token", fault_proxy=True)


@pytest.fixture(scope="session")
def task_images(open_registry: RegistryHandle):
    """The rehearsal's task images: the stand-in ubuntu:22.04 (sandbox/task_image.py) pushed to the open
    registry, which is the docker.io mirror; unpacked once per session under the registry's state dir."""
    from rehearsal.task_image import TaskImages
    from sandbox.task_image import mirrors_for, push_task_image

    push_task_image(open_registry.host)
    return TaskImages(open_registry.state_dir / "rehearsal-images", mirrors=mirrors_for(open_registry.host),
                      insecure_hosts=[open_registry.host])
