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
