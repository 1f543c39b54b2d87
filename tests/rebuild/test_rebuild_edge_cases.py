"""Rebuild-check edge cases on the real stack, decided without starting any pipeline.

Two guard fixed bugs in ``activities/source.py::_rebuild_decision`` (disagreeing Harbor pins; harbor_ref).
"""

from __future__ import annotations

import git
import pytest

from sandbox.git_remotes import advance_harbor, commit_to_remote
from tests.rebuild.helpers import git_show, pin_current_head, run_check

pytestmark = pytest.mark.stack

CFG = "cloud/iris/configs/harbor_fsdp2_smoke.yaml"


def _touch_cloud_iris(stack) -> str:
    url = stack.remotes.marinskyrl_url
    return commit_to_remote(url, {CFG: git_show(url, "main", CFG) + "# tweak\n"}, "Tweak the smoke config")


async def test_docs_only_change_needs_no_rebuild_but_a_dockerfile_edit_does(service_stack):
    s = service_stack
    url = s.remotes.marinskyrl_url
    pin_current_head(s, harbor_commit=s.remotes.harbor_head)
    ops = ".agents/ops/gpu-rl-image-build.md"
    commit_to_remote(url, {ops: git_show(url, "main", ops) + "\nA note.\n"}, "Docs")
    quiet = await run_check(s, start_pipeline=False)
    assert not quiet.decision.needed, quiet.decision.reasons
    df = "docker/Dockerfile.gpu-rl"
    commit_to_remote(url, {df: git_show(url, "main", df).replace("TORCH_VERSION=2.11.0", "TORCH_VERSION=2.11.1", 1)},
                     "Bump torch")
    loud = await run_check(s, start_pipeline=False)
    assert loud.decision.needed and any(r.startswith(df) for r in loud.decision.reasons)
    assert not loud.started and loud.pipeline_workflow_id


async def test_pins_disagreeing_on_harbor_need_a_rebuild(service_stack):
    s = service_stack
    # Standard was rebuilt with Harbor's head, Megatron still has the old Harbor: one strategy switch
    # would cross a Harbor boundary (domain §2.3), so the pair must be rebuilt together.
    pin_current_head(s, harbor_commit=s.remotes.harbor_head,
                     harbor_by_variant={"megatron": s.remotes.harbor_pinned})
    _touch_cloud_iris(s)
    res = await run_check(s, start_pipeline=False, variants=("standard", "megatron"))
    assert res.decision.needed, res.decision.reasons


async def test_check_follows_the_requested_harbor_ref(service_stack):
    s = service_stack
    release = s.remotes.harbor_head
    git.Repo(s.remotes.harbor_url.removeprefix("file://")).create_head("release", release)
    pin_current_head(s, harbor_commit=release)
    advance_harbor(s.remotes, 5)  # main moves on; the release branch does not
    _touch_cloud_iris(s)
    res = await run_check(s, start_pipeline=False, harbor_ref="release")
    assert res.decision.harbor_commit == release
    assert not res.decision.needed, res.decision.reasons
