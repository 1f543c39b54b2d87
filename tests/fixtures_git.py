"""Git fixtures: fresh bare Harbor and MarinSkyRL remotes per test (seeding takes well under a second)."""

from __future__ import annotations

import pytest

from sandbox.git_remotes import SeededRemotes, seed_remotes


@pytest.fixture
def seeded_remotes(tmp_path) -> SeededRemotes:
    """Bare ``harbor.git`` and ``marinskyrl.git`` under ``tmp_path/remotes`` (see sandbox.git_remotes)."""
    return seed_remotes(tmp_path / "remotes")
