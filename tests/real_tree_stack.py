"""The service pointed at a real MarinSkyRL tree (../shared/real-marinskyrl/<era>) instead of the fixture.

Why: the sandbox remotes hold the fixture repository; planning from the real upstream files is what a
new user does. This seeds a bare remote with one commit of the real tree (plus a per-test marker file,
so workflow ids never collide), writes a copy of the test's configuration whose
``repos.marinskyrl_url`` points at it, and runs an in-process worker with that configuration on the
test's own task queue. Everything else (Temporal, Iris, registries, Harbor remote) is the test's stack.
"""

from __future__ import annotations

import contextlib
import dataclasses
import shutil
import tomllib
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import pytest

from domain.config import load_config
from sandbox.git_remotes import seed_tree_remote
from sandbox.stack import to_toml
from tests.contract.real import add_upstream_rest
from worker import build_worker

# ../shared beside the checkout (also from a worktree under /work/wt/<name>: the nearest ancestor holding it).
REAL = next((p / "shared" / "real-marinskyrl" for p in Path(__file__).resolve().parents
             if (p / "shared" / "real-marinskyrl").is_dir()),
            Path(__file__).resolve().parents[2] / "shared" / "real-marinskyrl")


def real_tree(era: str) -> Path:
    path = REAL / era
    if not path.is_dir():
        pytest.skip(f"real MarinSkyRL files not present at {path}")
    return path


@contextlib.asynccontextmanager
async def real_tree_service(stack, era: str, tag: str, *,
                            edits: dict[str, Callable[[str], str] | None] | None = None,
                            config_update: dict[str, dict] | None = None) -> AsyncIterator:
    """``stack`` (a ServiceStack from ``service_config``) re-pointed at a remote seeded from ``era``
    (``config_update``: sections of the configuration copy to update, e.g. ``{"github": {...}}``)."""
    tree = stack.state_dir / f"tree-{era}"
    shutil.copytree(real_tree(era), tree)
    add_upstream_rest(tree)  # what the real Dockerfiles COPY from a full checkout
    for rel, edit in (edits or {}).items():
        f = tree / rel
        if edit is None:
            f.unlink()
        else:  # an edit of a path the tree lacks creates it (from "")
            f.parent.mkdir(parents=True, exist_ok=True)
            f.write_text(edit(f.read_text() if f.exists() else ""))
    url, head = seed_tree_remote(stack.state_dir / "remotes" / f"real-{era}.git", tree,
                                 {"tests/nodeid.txt": tag + "\n"}, f"real {era} tree")
    path = stack.state_dir / f"config-{era}.toml"
    text = stack.config_path.read_text()
    assert stack.remotes.marinskyrl_url in text
    text = text.replace(stack.remotes.marinskyrl_url, url)
    if config_update:
        data = tomllib.loads(text)
        for section, values in config_update.items():
            data.setdefault(section, {}).update(values)
        text = to_toml(data)
    path.write_text(text)
    config = load_config(path)
    remotes = stack.remotes.model_copy(update={"marinskyrl_url": url, "marinskyrl_head": head})
    real = dataclasses.replace(stack, config=config, config_path=path, remotes=remotes)
    async with build_worker(stack.client, config, graceful_shutdown_s=5):
        yield real
