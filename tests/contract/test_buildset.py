"""Build-set planner: every value from the contract; refusals name what is wrong."""

from __future__ import annotations

import re

import pytest

from domain.buildset import BuildRequest, BuildSetError, CompatibilityRequest, plan_targets

from .helpers import COMMIT, HARBOR, OPS, SCRIPT, contract, edited

ASK = CompatibilityRequest(requested_by="alice", reason="Megatron gate still resolves an image",
                           link="https://github.com/marin-community/marin/issues/7920")


def plan(c=None, **kw):
    req_kw = {k: kw.pop(k) for k in list(kw) if k in BuildRequest.model_fields}
    req = BuildRequest(architectures=req_kw.pop("architectures", ["amd64", "arm64"]),
                       compatibility_request=req_kw.pop("compatibility_request", ASK), **req_kw)
    return plan_targets(c or contract(), req, build_commit=kw.get("build_commit", COMMIT),
                        harbor_commit=kw.get("harbor_commit", HARBOR), cluster_archs=kw.get("cluster_archs"),
                        image_repository_override=kw.get("image_repository_override"))


def test_full_build_set():
    targets = plan()
    assert [t.key for t in targets] == ["amd64-standard", "amd64-megatron", "arm64-standard", "arm64-megatron"]
    tags = {t.key: t.tag for t in targets}
    assert tags == {"amd64-standard": f"gpu-rl-{COMMIT}", "amd64-megatron": f"gpu-rl-megatron-{COMMIT}",
                    "arm64-standard": f"gpu-rl-{COMMIT}-arm64",
                    "arm64-megatron": f"gpu-rl-megatron-{COMMIT}-arm64"}
    names = [t.job.job_name for t in targets]
    assert len(set(names)) == 4
    assert all(len(n) <= 63 and re.fullmatch(r"[a-z0-9-]+", n) for n in names)
    assert all(t.floating_tag is None and t.wheel_source == "wheel-builder" for t in targets)
    amd, arm = targets[0], targets[2]
    assert (amd.cluster, amd.job.priority, amd.job.timeout_s, amd.job.max_retries_failure) == (
        "cw-rno2a", "interactive", 18000, 0)
    assert (arm.cluster, arm.job.timeout_s, arm.job.max_retries_failure, arm.job.resources.gpu) == (
        "cw-us-east-08a", 28800, 3, "GB200x1")
    assert amd.job.resources.memory_bytes == 512 * 2**30 and amd.job.resources.cpu == 48
    assert (amd.kaniko_platform, arm.kaniko_platform) == ("linux/amd64", "linux/arm64")
    assert amd.job.no_sync and amd.job.enable_extra_resources
    assert amd.job.task_image == "docker.io/library/ubuntu:22.04"
    assert amd.job.script_env_var == "BUILD_B64" and amd.job.script_path == SCRIPT
    assert amd.job.command[:2] == ["bash", "-lc"]


def test_env_satisfies_script_and_keeps_secrets_as_refs():
    c = contract()
    for t in plan(c):
        env = {e.name: e for e in t.job.env}
        for name in c.script.required_when({e.name: e.value or "x" for e in t.job.env}):
            assert name in env
        assert env["GHCR_TOKEN"].secret == "registry_token" and env["GHCR_TOKEN"].value is None
        assert env["DOCKER_USER_ID"].secret == "registry_user" and env["DOCKER_USER_ID"].value is None
        assert env["GITSHA"].value == COMMIT and env["WHEEL_SOURCE"].value == "wheel-builder"
        assert not (set(env) & set(c.script.pinned_args))
        if t.variant == "megatron":
            assert env["INSTALL_MEGATRON"].value == "1" and env["TAG_PREFIX"].value == "gpu-rl-megatron"
        else:
            assert "INSTALL_MEGATRON" not in env


def test_markers_attached_per_target():
    for t in plan(image_repository_override="127.0.0.1:5000/m/r"):
        push = [m for m in t.expected_markers if m.role == "push"]
        assert push[0].text == f"Pushing image to 127.0.0.1:5000/m/r:{t.tag}"
        assert t.image_repository == "127.0.0.1:5000/m/r"
        assert {e.name: e.value for e in t.job.env}["GHCR_IMAGE_REPOSITORY"] == "127.0.0.1:5000/m/r"


def test_refuses_without_compatibility_request():
    with pytest.raises(BuildSetError, match="compatibility request"):
        plan(compatibility_request=None)


@pytest.mark.parametrize(("kw", "named"), [
    ({"architectures": ["amd64", "ppc64le"]}, "ppc64le"),
    ({"variants": ["standard", "deepspeed"]}, "deepspeed"),
    ({"priority": "urgent"}, "urgent"),
])
def test_unknown_values_are_named(kw, named):
    with pytest.raises(BuildSetError, match=named):
        plan(**kw)


def test_cluster_override_and_native_arch_check():
    targets = plan(architectures=["arm64"], clusters={"arm64": "sandbox-arm64"},
                   cluster_archs={"sandbox-arm64": "arm64", "sandbox-amd64": "amd64"})
    assert {t.cluster for t in targets} == {"sandbox-arm64"}
    with pytest.raises(BuildSetError, match="native"):
        plan(architectures=["arm64"], clusters={"arm64": "sandbox-amd64"},
             cluster_archs={"sandbox-amd64": "amd64"})
    with pytest.raises(BuildSetError, match="cw-rno2a"):  # placement fallback vs live state
        plan(architectures=["amd64"], cluster_archs={"cw-rno2a": "arm64"})


def test_priority_override_and_floating():
    targets = plan(architectures=["amd64"], variants=["standard"], priority="batch", push_floating=True)
    (t,) = targets
    assert t.job.priority == "batch" and t.floating_tag == "gpu-rl"
    assert {e.name: e.value for e in t.job.env}["PUSH_FLOATING"] == "1"


def test_prebuilt_only_with_usable_artifact():
    usable = edited(OPS, lambda s: s.replace("| usable | no |", "| usable | yes |"))
    targets = {t.key: t for t in plan(contract(usable))}
    amd = targets["amd64-standard"]
    assert amd.wheel_source == "prebuilt-wheelhouse"
    env = {e.name: e.value for e in amd.job.env}
    assert env["WHEEL_SOURCE"] == "prebuilt-wheelhouse"
    assert env["PREBUILT_WHEEL_ARTIFACT_URI"].startswith("s3://") and len(env["PREBUILT_WHEEL_ARTIFACT_SHA256"]) == 64
    assert targets["arm64-standard"].wheel_source == "wheel-builder"  # no aarch64 prebuilt, arch default
    truncated = edited(OPS, lambda s: s.replace("| usable | no |", "| usable | yes |")
                       .replace("9f2c4e6a8b0d1f3e5c7a9b2d4f6e8a0c1e3b5d7f9a2c4e6b8d0f1a3c5e7b9d2f", "9f2c4e6a8b0d"))
    assert {t.wheel_source for t in plan(contract(truncated))} == {"wheel-builder"}
    wrong_platform = edited(OPS, lambda s: s.replace("| usable | no |", "| usable | yes |")
                            .replace("| manifest platform | linux_x86_64 |", "| manifest platform | linux_aarch64 |"))
    assert {t.wheel_source for t in plan(contract(wrong_platform))} == {"wheel-builder"}


def test_harbor_and_commit_must_match_the_contract():
    with pytest.raises(BuildSetError, match="HARBOR_COMMIT"):
        plan(harbor_commit="c" * 40)
    with pytest.raises(BuildSetError, match="not the commit"):
        plan(build_commit="c" * 40)


def test_new_required_variable_without_a_value_is_refused():
    files = edited(SCRIPT, lambda t: t.replace(': "${GHCR_TOKEN:?', ': "${WANDB_API_KEY:?needed}"\n: "${GHCR_TOKEN:?'))
    with pytest.raises(BuildSetError, match="WANDB_API_KEY"):
        plan(contract(files))


def test_era_c_plan_uses_era_c_names():
    from .test_script import era_c

    files = edited(SCRIPT, era_c)
    files = edited(OPS, lambda s: s.replace("DOCKER_USER_ID", "REGISTRY_USER").replace("GHCR_TOKEN", "REGISTRY_TOKEN"),
                   files)
    (t,) = plan(contract(files), architectures=["amd64"], variants=["standard"], image_repository_override="r.example/x")
    env = {e.name: e for e in t.job.env}
    assert env["REGISTRY_TOKEN"].secret == "registry_token" and env["REGISTRY_USER"].secret == "registry_user"
    assert env["IMAGE_REPOSITORY"].value == "r.example/x"
    # era C's `auto` default resolves a content-addressed wheelhouse inside the task: kept as the default
    assert t.wheel_source == "auto" and env["WHEEL_SOURCE"].value == "auto"


def test_template_passing_a_pin_is_refused():
    files = edited(OPS, lambda s: s.replace("  -e WHEEL_SOURCE wheel-builder \\\n",
                                            "  -e WHEEL_SOURCE wheel-builder \\\n  -e TORCH_VERSION 2.10.0 \\\n", 1))
    with pytest.raises(BuildSetError, match="TORCH_VERSION"):
        plan(contract(files))


def _bound(c, override="registry.local:5000/gpu-rl"):
    req = BuildRequest(architectures=["amd64", "arm64"], compatibility_request=ASK)
    return plan_targets(c, req, build_commit=COMMIT, harbor_commit=HARBOR, cluster_archs=None,
                        image_repository_override=override, registry_host="registry.local:5000")


def test_the_registry_credential_goes_only_to_the_configured_host():
    """issue #21 item 2: a destination the repository chooses on another host refuses the plan."""
    assert {t.image_repository for t in _bound(contract())} == {"registry.local:5000/gpu-rl"}
    # The script's default repository on another host: it decides nothing once configured ...
    c = contract(edited(SCRIPT, lambda s: s.replace("ghcr.io/marin-community/marinskyrl",
                                                    "collector.example:5000/x")))
    assert {t.image_repository for t in _bound(c)} == {"registry.local:5000/gpu-rl"}
    # ... and without the configured repository it is refused naming file:line and the host.
    with pytest.raises(BuildSetError, match=rf"{SCRIPT}:\d+: image repository collector.example:5000/x is on "
                                            r"collector.example:5000"):
        _bound(c, override=None)
    # A cache repository on another host (kaniko would push layers there with the token).
    c = contract(edited(SCRIPT, lambda s: s.replace("${KANIKO_CACHE_REPOSITORY:-$REPO/$CACHE_NAME}",
                                                    "${KANIKO_CACHE_REPOSITORY:-collector.example:5000/cache}")))
    with pytest.raises(BuildSetError, match=rf"{SCRIPT}:\d+: amd64 cache repository collector.example:5000/cache "
                                            r"is on collector.example:5000.*nothing was pushed"):
        _bound(c)
