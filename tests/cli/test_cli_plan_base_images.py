"""`build --plan` of the real era-C tree looks every pulled image up in its registry through the service (real
Temporal, worker, CLI; the stack's open registry is the docker.io and gcr.io mirror holding the multi-platform
stand-in bases, sandbox/base_images.py). The unedited tree plans with each base and crane read found; a base tag
that does not exist is refused before anything is submitted, naming the FROM line, the reference, the platform
and the registry's answer (the old code planned it: nothing asked the registry)."""

from __future__ import annotations

import pytest

from tests.cli.test_cli_plan_real import _plan, _report
from tests.contract.real import line_in
from tests.real_tree_stack import real_tree_service

pytestmark = pytest.mark.stack

DF = "docker/Dockerfile.gpu-rl"
CUDA = "nvidia/cuda:12.9.2-cudnn-devel-ubuntu22.04"
ARGS = ("--arch", "amd64", "--variant", "standard", "--cluster", "amd64=sandbox-amd64")


async def test_plan_looks_up_every_pulled_image(service_config, request):
    async with real_tree_service(service_config, "era-c", request.node.nodeid) as s:
        assert s.config.policy.rehearsal_registry_mirrors.get("docker.io")
        ran = await _plan(s, *ARGS)
    assert ran.code == 0, ran.text
    (t,) = _report(ran.out).plan
    found = {(c.read.what, c.read.reference, c.read.platform, c.status) for c in t.rehearsal.image_checks}
    assert ("FROM", CUDA, "linux/amd64", "found") in found, found
    assert ("crane export", "gcr.io/kaniko-project/executor:latest", "linux/amd64", "found") in found, found
    assert all(c.status == "found" for c in t.rehearsal.image_checks)


async def test_plan_refuses_a_base_tag_that_does_not_exist(service_config, request):
    missing = "nvidia/cuda:12.9.2-cudnn-devel-ubuntu22.40"
    edit = {DF: lambda text: text.replace(f"ARG BASE_IMAGE={CUDA}", f"ARG BASE_IMAGE={missing}")}
    async with real_tree_service(service_config, "era-c", request.node.nodeid, edits=edit) as s:
        ran = await _plan(s, *ARGS)
    assert ran.code == 2, ran.text
    f = _report(ran.out).failure
    assert f.failure_class == "input" and "not in its registry" in f.message, f.message
    lines = [f"{DF}:{i}" for i, x in enumerate((line_in.__globals__["real_tree"]("era-c") / DF).read_text()
                                               .splitlines(), 1) if x.startswith("FROM ${BASE_IMAGE}")]
    assert any(f"{line} (the kaniko call at" in f.message for line in lines), f.message
    assert f"FROM {missing} for linux/amd64: no such tag or digest" in f.message, f.message
