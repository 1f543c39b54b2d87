"""The starter's refusals from the configuration alone (``check_against_config``) are refusals the
worker's plan makes too: every request refused before anything is read or started would have been
refused by planning (same configuration, declared architectures first), only later."""

from __future__ import annotations

import itertools

import pytest

from domain.buildset import BuildRequest, BuildSetError, CompatibilityRequest, plan_targets
from domain.operator_input import OperatorInputError, check_against_config

from .helpers import COMMIT, HARBOR, contract

ASK = CompatibilityRequest(requested_by="alice", reason="refusal before planning")
CONFIGS = {
    "ops placements, declared": {"cw-rno2a": "amd64", "cw-us-east-08a": "arm64"},
    "other names, declared": {"sb-amd64": "amd64", "sb-arm64": "arm64", "sb-down": "amd64"},
    "one undeclared": {"cw-rno2a": None, "cw-us-east-08a": "arm64"},
    "none": {},
}
ARCHS = (["amd64"], ["arm64"], ["riscv64"], ["amd64", "riscv64"], ["amd64", "arm64"])
VARIANTS = (["standard"], ["standard", "fancy"])
OVERRIDES = ({}, {"amd64": "cw-rno2a"}, {"amd64": "cw-us-east-08a"}, {"arm64": "cw-rno2a"}, {"amd64": "nope"},
             {"riscv64": "cw-rno2a"}, {"amd64": "sb-amd64"}, {"riscv64": "sb-arm64"})


def worker_refuses(request: BuildRequest, clusters: dict[str, str | None]) -> bool:
    """What activities/source.plan_targets decides before any live architecture is read."""
    if any(c not in clusters for c in request.clusters.values()):
        return True
    declared = {name: arch for name, arch in clusters.items() if arch}
    try:
        targets = plan_targets(contract(), request, build_commit=COMMIT, harbor_commit=HARBOR,
                               cluster_archs=declared, image_repository_override=None)
    except BuildSetError:
        return True
    return any(t.cluster not in clusters for t in targets)


def local_refusal(request: BuildRequest, clusters: dict[str, str | None]) -> str | None:
    try:
        check_against_config(request, clusters)
    except OperatorInputError as e:
        return str(e)
    return None


def test_every_refusal_from_the_configuration_is_one_planning_makes():
    refused = passed = 0
    flags = set()
    for (name, clusters), archs, variants, overrides in itertools.product(CONFIGS.items(), ARCHS, VARIANTS,
                                                                           OVERRIDES):
        req = BuildRequest(architectures=archs, variants=variants, compatibility_request=ASK, clusters=overrides)
        message = local_refusal(req, clusters)
        if message is None:
            passed += 1
            continue
        refused += 1
        flags.add(message.split(" ", 1)[0])
        assert worker_refuses(req, clusters), (name, req, message)
    assert refused and passed and flags == {"--arch", "--cluster", "--variant"}, (refused, passed, flags)


@pytest.mark.parametrize(("archs", "overrides", "clusters", "needle"), [
    (["riscv64"], {}, CONFIGS["other names, declared"],
     "--arch riscv64: no configured cluster runs riscv64 hosts (sb-amd64 amd64, sb-arm64 arm64, sb-down amd64)"),
    (["amd64"], {"amd64": "cw-us-east-08a"}, CONFIGS["ops placements, declared"],
     "--cluster amd64=cw-us-east-08a: cluster 'cw-us-east-08a' runs arm64 hosts"),
    (["amd64"], {"amd64": "nope"}, CONFIGS["one undeclared"], "--cluster amd64=nope: cluster 'nope' is not configured"),
    (["amd64"], {"arm64": "cw-rno2a"}, CONFIGS["ops placements, declared"],
     "--cluster arm64=cw-rno2a: 'arm64' is not a requested architecture (--arch amd64)"),
])
def test_the_refusal_names_the_flag_and_what_the_configuration_says(archs, overrides, clusters, needle):
    req = BuildRequest(architectures=archs, variants=["standard"], compatibility_request=ASK, clusters=overrides)
    assert needle in (local_refusal(req, clusters) or "")


def test_an_architecture_only_a_controller_can_tell_is_left_to_planning():
    req = BuildRequest(architectures=["riscv64"], variants=["standard"], compatibility_request=ASK)
    assert local_refusal(req, CONFIGS["one undeclared"]) is None
    assert worker_refuses(req, CONFIGS["one undeclared"])  # refused there, from the build script
