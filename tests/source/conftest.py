"""Fixtures for the source tests: real bare git remotes and a mirror cache in tmp_path."""

from __future__ import annotations

from pathlib import Path

import pytest

from clients.git_source import MirrorCache
from tests.source.repos import Remotes, make_remotes


@pytest.fixture
def remotes(tmp_path: Path) -> Remotes:
    """Fresh Harbor (3 commits) and MarinSkyRL (1 commit, pinned to Harbor commit 1) bare remotes."""
    return make_remotes(tmp_path / "remotes")


@pytest.fixture
def mirrors(tmp_path: Path) -> MirrorCache:
    return MirrorCache(tmp_path / "mirrors")
