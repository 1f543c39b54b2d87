"""Git fixtures: fresh bare Harbor and MarinSkyRL remotes per test.

Why a copy of one seed: ``seed_remotes`` is deterministic (fixed names and dates: the same fixtures give the
same commits; tests/sandbox/test_git_remotes.py::test_seeding_is_deterministic compares a fresh seed with
this fixture's copy), so each test gets a byte copy of the bare remotes that one real ``seed_remotes`` made
for the test process instead of seeding again: a directory copy (~0.1 s) instead of a dozen git processes
(1.2-1.8 s on a loaded 2-core machine), for every test on the service stack. Each test still gets remotes of
its own to commit to.
"""

from __future__ import annotations

import atexit
import shutil
import tempfile
from functools import partial
from pathlib import Path

import pytest

from sandbox.git_remotes import SeededRemotes, seed_remotes

_template: SeededRemotes | None = None


def fresh_remotes(root: Path) -> SeededRemotes:
    """Bare remotes under ``root`` holding exactly the commits ``seed_remotes(root)`` makes (a copy of the
    process's one seed, made at the first call and removed at exit)."""
    global _template
    if _template is None:
        where = tempfile.mkdtemp(prefix="remotes-template-")
        atexit.register(partial(shutil.rmtree, where, ignore_errors=True))
        _template = seed_remotes(Path(where) / "remotes")
    root = Path(root)
    shutil.copytree(_template.root, root)
    return _template.model_copy(deep=True, update={
        "root": root,
        "harbor_url": (root / "harbor.git").resolve().as_uri(),
        "marinskyrl_url": (root / "marinskyrl.git").resolve().as_uri(),
    })


@pytest.fixture
def seeded_remotes(tmp_path) -> SeededRemotes:
    """Bare ``harbor.git`` and ``marinskyrl.git`` under ``tmp_path/remotes`` (see sandbox.git_remotes)."""
    return fresh_remotes(tmp_path / "remotes")
