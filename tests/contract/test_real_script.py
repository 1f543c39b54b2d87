"""The executable contract of the real MarinSkyRL trees (era B, era C), read from a temporary git commit.

Every expected value below was read from the files in ../shared/real-marinskyrl by eye (line numbers
included), not produced by running the parser. Mutations check that the reader goes by meaning.
"""

from __future__ import annotations

import re

import pytest

from domain.contract import ContractError
from domain.contract.errors import ParserNeedsAttention
from domain.contract.script import render, shell_values
from domain.markers import expected_markers

from .real import DF_AMD, DF_ARM, SCRIPT, real_contract

SHA_RE = re.compile(r"[0-9a-f]{40}")


# ----------------------------------------------------------------------------- era B


def test_era_b_requirements_credentials_and_repository(tmp_path):
    s = real_contract(tmp_path, "era-b").script
    assert [(r.name, r.line) for r in s.required if r.always] == [
        ("GITSHA", 14), ("DOCKER_USER_ID", 15), ("GHCR_TOKEN", 16)]
    assert [(r.name, r.condition, r.line) for r in s.required if not r.always] == [
        ("PREBUILT_WHEEL_ARTIFACT_URI", "WHEEL_SOURCE=prebuilt-wheelhouse", 109),
        ("PREBUILT_WHEEL_ARTIFACT_SHA256", "WHEEL_SOURCE=prebuilt-wheelhouse", 110)]
    assert (s.credential_user_var, s.credential_token_var) == ("DOCKER_USER_ID", "GHCR_TOKEN")
    assert (s.image_repository_var, s.image_repository_default) == (
        "GHCR_IMAGE_REPOSITORY", "ghcr.io/marin-community/marinskyrl")
    assert s.lines["image_repository_default"] == 41
    assert s.required_when({"WHEEL_SOURCE": "wheel-builder"}) == ["GITSHA", "DOCKER_USER_ID", "GHCR_TOKEN"]


def test_era_b_arch_table_tags_and_cache(tmp_path):
    c = real_contract(tmp_path, "era-b")
    s = c.script
    amd, arm = s.arches["amd64"], s.arches["arm64"]
    assert (amd.uname, amd.kaniko_platform, amd.manifest_platform, amd.tag_suffix, amd.default_wheel_source) == (
        "x86_64", "linux/amd64", "linux_x86_64", "", "prebuilt-wheelhouse")
    assert (arm.uname, arm.kaniko_platform, arm.manifest_platform, arm.tag_suffix, arm.default_wheel_source) == (
        "aarch64", "linux/arm64", "linux_aarch64", "-arm64", "wheel-builder")
    assert (amd.line, arm.line) == (29, 32)
    assert arm.lines["kaniko_platform"] == 33 and arm.lines["tag_suffix"] == 34
    # the whole arm, whatever its variable names
    assert arm.settings == {"CRANE_ASSET_ARCH": "arm64", "KANIKO_PLATFORM": "linux/arm64",
                            "WHEEL_PLATFORM_TAG": "linux_aarch64", "ARCH_TAG_SUFFIX": "-arm64",
                            "DEFAULT_WHEEL_SOURCE": "wheel-builder"}
    assert (amd.cache_repo, arm.cache_repo) == ("{repository}/cache", "{repository}/cache-arm64")
    assert s.tag_pattern == "${TAG_PREFIX}-${GITSHA}${ARCH_TAG_SUFFIX}" and s.lines["tag_pattern"] == 101
    assert s.wheels_tag_pattern == "wheels-${GITSHA}${ARCH_TAG_SUFFIX}" and s.lines["wheels_tag_pattern"] == 212
    assert s.floating_tag_pattern == "${TAG_PREFIX}${ARCH_TAG_SUFFIX}" and s.floating_var == "PUSH_FLOATING"
    tags = {a: render(s.tag_pattern, shell_values(s, a, {}, c.commit)) for a in ("amd64", "arm64")}
    assert tags == {"amd64": f"gpu-rl-{c.commit}", "arm64": f"gpu-rl-{c.commit}-arm64"}


def test_era_b_pins_wheel_sources_and_schemes(tmp_path):
    s = real_contract(tmp_path, "era-b").script
    assert s.pinned_args == ["HARBOR_COMMIT", "VLLM_FORK_COMMIT", "VLLM_NATIVE_DONOR_COMMIT", "FLASH_ATTN_VERSION",
                             "TORCH_VERSION"]
    assert s.conditional_pinned_args == [] and s.lines["pinned_args"] == 69
    assert sorted(s.wheel_sources) == ["prebuilt-wheelhouse", "wheel-builder"]
    assert s.artifact_uri_schemes == ["s3://"]
    assert s.knobs["INSTALL_MEGATRON"].default == "0" and s.knobs["TAG_PREFIX"].default == "gpu-rl"
    assert s.knobs["DOCKERFILE"].default == "docker/Dockerfile.gpu-rl" and s.knobs["DOCKERFILE"].line == 46


def test_era_b_arm64_dockerfile_is_passed_explicitly_but_the_script_would_refuse_it(tmp_path):
    """Era B: DOCKERFILE defaults to the amd64 file on every host (line 46), the table sets none.

    The service passes the arm64 file explicitly (it exists, named default + `-arm64`); but that file
    declares no VLLM_NATIVE_DONOR_COMMIT, which era B's pin loop (line 69) checks on every build, so
    arm64 is refused at plan time with that reason instead of failing in the cluster."""
    s = real_contract(tmp_path, "era-b").script
    amd, arm = s.arches["amd64"], s.arches["arm64"]
    assert (amd.dockerfile, amd.dockerfile_origin, amd.dockerfile_env, amd.blocked) == (
        DF_AMD, "script default", None, None)
    assert (arm.dockerfile, arm.dockerfile_origin, arm.dockerfile_env) == (DF_ARM, "naming convention", "DOCKERFILE")
    assert f"{SCRIPT}:46" in arm.dockerfile_why and DF_ARM in arm.dockerfile_why
    assert arm.blocked and "VLLM_NATIVE_DONOR_COMMIT" in arm.blocked and f"{SCRIPT}:69" in arm.blocked


def test_era_b_arm64_with_the_pin_declared_builds_its_own_dockerfile(tmp_path):
    donor = "ARG VLLM_FORK_COMMIT=8672c71e311cb76a81154589cb60498b41dd59f7\n"
    c = real_contract(tmp_path, "era-b", {DF_ARM: lambda t: t.replace(
        donor, donor + "ARG VLLM_NATIVE_DONOR_COMMIT=8672c71e311cb76a81154589cb60498b41dd59f7\n", 1)})
    arm = c.script.arches["arm64"]
    assert arm.blocked is None and arm.dockerfile == DF_ARM and arm.dockerfile_env == "DOCKERFILE"
    markers = expected_markers(c, "arm64", "standard", "wheel-builder", f"gpu-rl-{c.commit}-arm64")
    pins = [m.text for m in markers if m.text and m.text.startswith("[pin]")]
    assert f"[pin] HARBOR_COMMIT=ad6e612d385379d3168638f6bfb2cf4a56cedbf9 (from {DF_ARM})" in pins
    assert any(m.source == DF_ARM for m in markers)


def test_era_b_without_arm64_dockerfile_blocks_arm64_instead_of_guessing(tmp_path):
    s = real_contract(tmp_path, "era-b", {DF_ARM: None}).script
    assert s.arches["amd64"].blocked is None
    assert s.arches["arm64"].blocked and "refusing to guess" in s.arches["arm64"].blocked


# ----------------------------------------------------------------------------- era C


def test_era_c_requirements_with_readable_conditions(tmp_path):
    s = real_contract(tmp_path, "era-c").script
    assert [(r.name, r.line) for r in s.required if r.always] == [
        ("GITSHA", 17), ("REGISTRY_USER", 18), ("REGISTRY_TOKEN", 19)]
    assert [(r.name, r.condition, r.line) for r in s.required if not r.always] == [
        ("HF_WHEEL_REPOSITORY", "WHEEL_SOURCE=auto", 163),
        ("HF_TOKEN", "WHEEL_SOURCE=auto", 164),
        ("HF_TOKEN", "WHEEL_SOURCE=wheel-builder and HF_WHEEL_REPOSITORY non-empty", 167),
        ("PREBUILT_WHEEL_ARTIFACT_URI", "WHEEL_SOURCE=prebuilt-wheelhouse", 201),
        ("PREBUILT_WHEEL_ARTIFACT_SHA256", "WHEEL_SOURCE=prebuilt-wheelhouse", 202)]
    always = ["GITSHA", "REGISTRY_USER", "REGISTRY_TOKEN"]
    assert s.required_when({"WHEEL_SOURCE": "wheel-builder"}) == always  # HF_WHEEL_REPOSITORY defaults to ""
    assert s.required_when({"WHEEL_SOURCE": "wheel-builder", "HF_WHEEL_REPOSITORY": "org/wheels"}) == [
        *always, "HF_TOKEN"]
    assert s.required_when({"WHEEL_SOURCE": "auto"}) == [*always, "HF_WHEEL_REPOSITORY", "HF_TOKEN"]
    assert s.required_when({"WHEEL_SOURCE": "prebuilt-wheelhouse"}) == [
        *always, "PREBUILT_WHEEL_ARTIFACT_URI", "PREBUILT_WHEEL_ARTIFACT_SHA256"]
    assert (s.credential_user_var, s.credential_token_var) == ("REGISTRY_USER", "REGISTRY_TOKEN")
    assert (s.image_repository_var, s.image_repository_default) == (
        "IMAGE_REPOSITORY", "ghcr.io/marin-community/marinskyrl")
    assert s.lines["image_repository_default"] == 49


def test_era_c_arch_table_sets_the_dockerfile(tmp_path):
    s = real_contract(tmp_path, "era-c").script
    amd, arm = s.arches["amd64"], s.arches["arm64"]
    assert (amd.dockerfile, amd.lines["dockerfile"], amd.dockerfile_origin, amd.dockerfile_env) == (
        DF_AMD, 38, "arch table", None)
    assert (arm.dockerfile, arm.lines["dockerfile"], arm.dockerfile_origin, arm.dockerfile_env) == (
        DF_ARM, 42, "arch table", None)
    assert (amd.tag_suffix, arm.tag_suffix) == ("", "-arm64")
    assert (amd.default_wheel_source, arm.default_wheel_source) == ("prebuilt-wheelhouse", "wheel-builder")
    assert (amd.blocked, arm.blocked) == (None, None)
    assert s.tag_pattern == "${TAG_PREFIX}-${GITSHA}${ARCH_TAG_SUFFIX}" and s.lines["tag_pattern"] == 151
    assert s.wheels_tag_pattern == "wheels-${GITSHA}${ARCH_TAG_SUFFIX}" and s.lines["wheels_tag_pattern"] == 298
    assert arm.cache_repo == "{repository}/cache-arm64" and s.lines["cache_repo"] == 137


def test_era_c_pins_per_wheel_source(tmp_path):
    s = real_contract(tmp_path, "era-c").script
    assert s.pinned_args == ["HARBOR_COMMIT", "VLLM_FORK_COMMIT", "FLASH_ATTN_VERSION", "TORCH_VERSION"]
    (donor,) = s.conditional_pinned_args
    assert (donor.name, donor.line) == ("VLLM_NATIVE_DONOR_COMMIT", 95)
    assert [str(g) for g in donor.when] == ["WHEEL_SOURCE=prebuilt-wheelhouse or WHEEL_SOURCE=auto"]
    held = {ws: all(g.holds({"WHEEL_SOURCE": ws}) for g in donor.when)
            for ws in ("prebuilt-wheelhouse", "auto", "wheel-builder")}
    assert held == {"prebuilt-wheelhouse": True, "auto": True, "wheel-builder": False}
    assert sorted(s.wheel_sources) == ["auto", "prebuilt-wheelhouse", "wheel-builder"]
    assert s.artifact_uri_schemes == ["s3://", "https://", "file://"]


def test_era_c_markers_from_echo_and_python_print(tmp_path):
    c = real_contract(tmp_path, "era-c")
    tag = f"gpu-rl-{c.commit}"
    std = expected_markers(c, "amd64", "standard", "prebuilt-wheelhouse", tag)
    meg = expected_markers(c, "amd64", "megatron", "prebuilt-wheelhouse", tag, job_env={"INSTALL_MEGATRON": "1"})
    log = "\n".join([
        "[arch] build host=x86_64 kaniko=linux/amd64 wheels=linux_x86_64 tag-suffix=none",
        "flash_attn 2.8.3 + flash_attn_2_cuda OK",
        "torch 2.11.0+cu129 | transformers 4.57.1 | vllm 0.11.1 | flash_attn 2.8.3",
        "baked harbor commit: ad6e612d385379d3168638f6bfb2cf4a56cedbf9",
    ])
    by_name = {m.name: m for m in std}
    arch = next(m for m in std if m.name.startswith("[arch]"))
    assert arch.text == "[arch] build host=x86_64 kaniko=linux/amd64 wheels=linux_x86_64 tag-suffix=none"
    flash = next(m for m in std if m.source == DF_AMD and m.name.startswith("flash_attn"))
    assert flash.search(log) and not flash.search("flash_attn + flash_attn_2_cuda OK")
    torch = next(m for m in std if m.name.startswith("torch "))
    assert torch.search(log)
    assert "baked harbor commit: ad6e612d385379d3168638f6bfb2cf4a56cedbf9" in by_name
    assert "torchtitan ExpertParallel import OK (apply_ep EP>1 unblocked)" in by_name
    assert "Megatron native imports OK" not in by_name
    meg_names = {m.name for m in meg}
    assert "Megatron native imports OK" in meg_names
    assert "torchtitan ExpertParallel import OK (apply_ep EP>1 unblocked)" not in meg_names
    # a failure message under `if uv pip check ...; then echo ...; exit 1` is never an expected marker
    assert not any("expected the known runtime metadata conflicts" in m.name for m in std)


def test_era_c_dockerfiles_pins_and_stages(tmp_path):
    c = real_contract(tmp_path, "era-c")
    amd, arm = c.dockerfiles[DF_AMD], c.dockerfiles[DF_ARM]
    assert (amd.pins["HARBOR_COMMIT"], amd.pin_lines["HARBOR_COMMIT"]) == ("ad6e612d385379d3168638f6bfb2cf4a56cedbf9", 83)
    assert amd.pins["VLLM_NATIVE_DONOR_COMMIT"] == "8672c71e311cb76a81154589cb60498b41dd59f7"
    assert "VLLM_NATIVE_DONOR_COMMIT" not in arm.pins and arm.pins["TORCH_CUDA_ARCH_LIST"] == "9.0;10.0"
    assert [s.name for s in amd.stages] == ["wheel-builder", "wheel-artifact", "prebuilt-wheelhouse", "wheels", "rl"]
    assert amd.final_stage.line == 183
    assert amd.labels()["org.marin.harbor-commit"] == "${HARBOR_COMMIT}"


# ----------------------------------------------------------------------------- mutations


def test_new_unconditional_required_variable_is_picked_up(tmp_path):
    c = real_contract(tmp_path, "era-c", {SCRIPT: lambda t: t.replace(
        ': "${REGISTRY_TOKEN:?}"\n', ': "${REGISTRY_TOKEN:?}"\n: "${WANDB_API_KEY:?WANDB_API_KEY is required}"\n', 1)})
    req = {r.name: r for r in c.script.required}
    assert req["WANDB_API_KEY"].always and req["WANDB_API_KEY"].line == 20
    assert "WANDB_API_KEY" in c.script.required_when({"WHEEL_SOURCE": "wheel-builder"})


def test_renamed_arch_table_variable_is_read_by_meaning(tmp_path):
    s = real_contract(tmp_path, "era-b", {SCRIPT: lambda t: t.replace("ARCH_TAG_SUFFIX", "ARCH_SUFFIX")
                                          .replace("KANIKO_PLATFORM", "BUILD_PLATFORM")}).script
    assert (s.arches["amd64"].tag_suffix, s.arches["arm64"].tag_suffix) == ("", "-arm64")
    assert s.arches["arm64"].kaniko_platform == "linux/arm64"
    assert s.tag_pattern == "${TAG_PREFIX}-${GITSHA}${ARCH_SUFFIX}"
    assert s.arches["arm64"].cache_repo == "{repository}/cache-arm64"


def test_arch_table_variable_renamed_only_in_the_table_fails_closed_naming_the_field(tmp_path):
    def edit(t: str) -> str:
        return t.replace('ARCH_TAG_SUFFIX=""', 'ARCH_SUFFIX=""').replace('ARCH_TAG_SUFFIX="-arm64"', 'ARCH_SUFFIX="-arm64"')
    with pytest.raises(ParserNeedsAttention) as e:
        real_contract(tmp_path, "era-c", {SCRIPT: edit})
    err = e.value
    assert (err.file, err.line, err.field) == (SCRIPT, 35, "tag suffix")
    assert f"{SCRIPT}:35:" in str(err) and "needs attention" in str(err) and "parser" in str(err)


@pytest.mark.parametrize("broken", [': "${GHCR_TOKEN:?"', ': "${GHCR_TOKEN:?}'])
def test_syntax_error_in_a_requirement_fails_closed_at_its_line(tmp_path, broken):
    with pytest.raises(ContractError) as e:
        real_contract(tmp_path, "era-b", {SCRIPT: lambda t: t.replace(': "${GHCR_TOKEN:?}"', broken, 1)})
    assert (e.value.file, e.value.line) == (SCRIPT, 16)
    assert str(e.value).startswith(f"{SCRIPT}:16: ") and "syntax" in str(e.value)


def test_unneeded_construct_does_not_block(tmp_path):
    extra = 'declare -A MIRRORS=([ghcr.io]=mirror.example)\nselect opt in a b; do break; done\n'
    s = real_contract(tmp_path, "era-c", {SCRIPT: lambda t: t.replace("set +x\n", "set +x\n" + extra, 1)}).script
    assert s.always_required == ["GITSHA", "REGISTRY_USER", "REGISTRY_TOKEN"]


def earlier_era_b(text: str) -> str:
    """Era B before the `uname -m` table: one amd64 host, literal platform values, no tag suffix."""
    start = text.index("# ARCH_TAG_SUFFIX keeps")
    end = text.index("# Registry home is")
    text = text[:start] + text[end:]
    return (text.replace("${ARCH_TAG_SUFFIX}", "").replace("$DEFAULT_WHEEL_SOURCE", "prebuilt-wheelhouse")
            .replace("${WHEEL_PLATFORM_TAG}", "linux_x86_64").replace("${CRANE_ASSET_ARCH}", "x86_64")
            .replace('crane export --platform "$KANIKO_PLATFORM" ', "crane export "))


def test_earlier_era_b_without_arch_table_builds_amd64_only(tmp_path):
    c = real_contract(tmp_path, "era-b", {SCRIPT: earlier_era_b})
    s = c.script
    assert list(s.arches) == ["amd64"]
    amd = s.arches["amd64"]
    assert (amd.uname, amd.kaniko_platform, amd.tag_suffix, amd.dockerfile, amd.default_wheel_source) == (
        "x86_64", "linux/amd64", "", DF_AMD, "prebuilt-wheelhouse")
    assert s.tag_pattern == "${TAG_PREFIX}-${GITSHA}" and amd.blocked is None
    assert amd.cache_repo == "{repository}/cache"


def test_arch_table_that_sets_the_executor_dockerfile_variable_itself(tmp_path):
    """A revision whose table assigns DOCKERFILE directly (no DEFAULT_DOCKERFILE knob) still chooses per arch."""
    def edit(t: str) -> str:
        return (t.replace("DEFAULT_DOCKERFILE=docker/Dockerfile.gpu-rl ;;", "DOCKERFILE=docker/Dockerfile.gpu-rl ;;")
                .replace("DEFAULT_DOCKERFILE=docker/Dockerfile.gpu-rl-arm64 ;;", "DOCKERFILE=docker/Dockerfile.gpu-rl-arm64 ;;")
                .replace('DOCKERFILE="${DOCKERFILE:-$DEFAULT_DOCKERFILE}"\n', ""))
    s = real_contract(tmp_path, "era-c", {SCRIPT: edit}).script
    assert (s.arches["amd64"].dockerfile, s.arches["arm64"].dockerfile) == (DF_AMD, DF_ARM)
    assert (s.arches["arm64"].dockerfile_origin, s.arches["arm64"].lines["dockerfile"]) == ("arch table", 42)


def test_destination_through_an_image_variable(tmp_path):
    def edit(t: str) -> str:
        return t.replace('DESTINATIONS=(--destination "${IMAGE_REPOSITORY}:${IMAGE_TAG}")',
                         'IMAGE="${IMAGE_REPOSITORY}:${IMAGE_TAG}"\nDESTINATIONS=(--destination "$IMAGE")')
    s = real_contract(tmp_path, "era-c", {SCRIPT: edit}).script
    assert (s.image_repository_var, s.tag_pattern) == ("IMAGE_REPOSITORY", "${TAG_PREFIX}-${GITSHA}${ARCH_TAG_SUFFIX}")
    assert s.lines["tag_pattern"] == 151


def test_tag_from_two_table_values_and_a_shared_suffix_is_refused(tmp_path):
    two = real_contract(tmp_path / "two", "era-c", {SCRIPT: lambda t: t.replace(
        'IMAGE_TAG="${TAG_PREFIX}-${GITSHA}${ARCH_TAG_SUFFIX}"',
        'IMAGE_TAG="${TAG_PREFIX}-${GITSHA}${ARCH_TAG_SUFFIX}-${CRANE_ASSET_ARCH}"')}).script
    assert (two.arches["amd64"].tag_suffix, two.arches["arm64"].tag_suffix) == ("-x86_64", "-arm64-arm64")
    with pytest.raises(ContractError) as e:
        real_contract(tmp_path / "shared", "era-c", {SCRIPT: lambda t: t.replace('ARCH_TAG_SUFFIX="-arm64"',
                                                                                  'ARCH_TAG_SUFFIX=""')})
    assert (e.value.file, e.value.line) == (SCRIPT, 34) and "overwrites" in str(e.value)
