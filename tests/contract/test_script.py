"""Build-script parser: the fixture (era B) and the era A / era C shapes, plus fail-closed errors."""

from __future__ import annotations

import re

import pytest

from domain.contract import ContractError, parse_script

from .helpers import SCRIPT, contract, edited, fixture_files, line_of


def script_text() -> str:
    return fixture_files()[SCRIPT]


def test_fixture_required_variables_and_conditions():
    s = parse_script(script_text())
    assert s.always_required == ["GITSHA", "DOCKER_USER_ID", "GHCR_TOKEN"]
    conditional = {r.name: [str(c) for c in r.when] for r in s.required if not r.always}
    assert conditional == {
        "PREBUILT_WHEEL_ARTIFACT_URI": ["WHEEL_SOURCE=prebuilt-wheelhouse"],
        "PREBUILT_WHEEL_ARTIFACT_SHA256": ["WHEEL_SOURCE=prebuilt-wheelhouse"],
    }
    assert s.required_when({"WHEEL_SOURCE": "wheel-builder"}) == ["GITSHA", "DOCKER_USER_ID", "GHCR_TOKEN"]
    assert len(s.required_when({"WHEEL_SOURCE": "prebuilt-wheelhouse"})) == 5
    assert (s.credential_user_var, s.credential_token_var) == ("DOCKER_USER_ID", "GHCR_TOKEN")
    assert s.task_guard_var == "IRIS_TASK_ID"


def test_fixture_arch_table():
    s = parse_script(script_text())
    assert set(s.arches) == {"amd64", "arm64"}
    amd, arm = s.arches["amd64"], s.arches["arm64"]
    assert (amd.uname, amd.dockerfile, amd.kaniko_platform, amd.manifest_platform) == (
        "x86_64", "docker/Dockerfile.gpu-rl", "linux/amd64", "linux_x86_64")
    assert (amd.tag_suffix, amd.cache_repo, amd.default_wheel_source) == ("", "{repository}/cache", "prebuilt-wheelhouse")
    assert (arm.uname, arm.dockerfile, arm.kaniko_platform, arm.manifest_platform) == (
        "aarch64", "docker/Dockerfile.gpu-rl-arm64", "linux/arm64", "linux_aarch64")
    assert (arm.tag_suffix, arm.cache_repo, arm.default_wheel_source) == ("-arm64", "{repository}/cache-arm64", "wheel-builder")
    assert (s.arch_var, s.uname_override_var) == ("HOST_ARCH", "SANDBOX_UNAME_M")


def test_fixture_pins_knobs_and_tags():
    s = parse_script(script_text())
    assert s.pinned_args == ["HARBOR_COMMIT", "VLLM_FORK_COMMIT", "FLASH_ATTN_VERSION", "TORCH_VERSION"]
    assert [(p.name, [str(c) for c in p.when]) for p in s.conditional_pinned_args] == [
        ("VLLM_NATIVE_DONOR_COMMIT", ["WHEEL_SOURCE=prebuilt-wheelhouse"])]
    assert s.wheel_sources == ["prebuilt-wheelhouse", "wheel-builder"]
    assert s.artifact_uri_schemes == ["s3://", "file://"]
    defaults = {k: v.default for k, v in s.knobs.items()}
    assert defaults["INSTALL_MEGATRON"] == "0" and defaults["TAG_PREFIX"] == "gpu-rl"
    assert defaults["SINGLE_SNAPSHOT"] == "0" and defaults["KANIKO_CACHE"] == "1"
    assert defaults["PUSH_FLOATING"] == "0" and defaults["PRESERVE_WHEELS"] == "1"
    assert (s.image_repository_var, s.image_repository_default) == (
        "GHCR_IMAGE_REPOSITORY", "ghcr.io/marin-community/marinskyrl")
    assert (s.tag_prefix_var, s.megatron_var, s.floating_var, s.preserve_wheels_var, s.dockerfile_var) == (
        "TAG_PREFIX", "INSTALL_MEGATRON", "PUSH_FLOATING", "PRESERVE_WHEELS", "DOCKERFILE")
    assert s.tag_pattern == "${TAG_PREFIX}-${GITSHA}${TAG_SUFFIX}"
    assert s.wheels_tag_pattern == "wheels-${GITSHA}${TAG_SUFFIX}"
    assert s.floating_tag_pattern == "${TAG_PREFIX}${TAG_SUFFIX}"


def era_a(text: str) -> str:
    """Era A: one DOCKER_TOKEN, the open-thoughts repository, no user variable."""
    text = text.replace(': "${DOCKER_USER_ID:?DOCKER_USER_ID must name the registry user}"\n', "")
    text = text.replace('"$DOCKER_USER_ID" "$GHCR_TOKEN"', '"openthoughts" "$DOCKER_TOKEN"')
    text = text.replace("GHCR_TOKEN", "DOCKER_TOKEN")
    return text.replace("ghcr.io/marin-community/marinskyrl", "ghcr.io/open-thoughts/openthoughts-agent")


def era_c(text: str) -> str:
    """Era C: REGISTRY_USER / REGISTRY_TOKEN, IMAGE_REPOSITORY, WHEEL_SOURCE=auto, https:// artifacts."""
    text = text.replace("DOCKER_USER_ID", "REGISTRY_USER").replace("GHCR_TOKEN", "REGISTRY_TOKEN")
    text = text.replace("GHCR_IMAGE_REPOSITORY", "IMAGE_REPOSITORY")
    text = text.replace("prebuilt-wheelhouse|wheel-builder) ;;", "prebuilt-wheelhouse|wheel-builder|auto) ;;")
    text = text.replace("DEFAULT_WHEEL_SOURCE=prebuilt-wheelhouse", "DEFAULT_WHEEL_SOURCE=auto")
    return text.replace("s3://*|file://*) ;;", "s3://*|https://*|file://*) ;;")


def test_era_a_docker_token():
    s = parse_script(era_a(script_text()))
    assert s.always_required == ["GITSHA", "DOCKER_TOKEN"]
    assert s.credential_token_var == "DOCKER_TOKEN" and s.credential_user_var is None
    assert s.image_repository_default == "ghcr.io/open-thoughts/openthoughts-agent"


def test_era_c_registry_user_token_image_repository_auto():
    s = parse_script(era_c(script_text()))
    assert s.always_required == ["GITSHA", "REGISTRY_USER", "REGISTRY_TOKEN"]
    assert (s.credential_user_var, s.credential_token_var) == ("REGISTRY_USER", "REGISTRY_TOKEN")
    assert s.image_repository_var == "IMAGE_REPOSITORY"
    assert s.wheel_sources == ["prebuilt-wheelhouse", "wheel-builder", "auto"]
    assert s.arches["amd64"].default_wheel_source == "auto"
    assert s.artifact_uri_schemes == ["s3://", "https://", "file://"]


def test_new_required_variable_is_picked_up():
    text = script_text().replace(': "${GHCR_TOKEN:?', ': "${HF_TOKEN:?HF_TOKEN is required}"\n: "${GHCR_TOKEN:?')
    s = parse_script(text)
    assert "HF_TOKEN" in s.always_required


RISCV_ARM = """  riscv64)
    DEFAULT_DOCKERFILE=docker/Dockerfile.gpu-rl-riscv64
    CRANE_ASSET=riscv64
    KANIKO_PLATFORM=linux/riscv64
    MANIFEST_PLATFORM=linux_riscv64
    TAG_SUFFIX=-riscv64
    CACHE_NAME=cache-riscv64
    DEFAULT_WHEEL_SOURCE=wheel-builder
    ;;
  *)
"""


def test_added_architecture_row():
    text = script_text().replace("  *)\n    echo \"unsupported build host", RISCV_ARM + "    echo \"unsupported build host", 1)
    s = parse_script(text)
    assert set(s.arches) == {"amd64", "arm64", "riscv64"}
    r = s.arches["riscv64"]
    assert (r.uname, r.kaniko_platform, r.tag_suffix, r.cache_repo) == (
        "riscv64", "linux/riscv64", "-riscv64", "{repository}/cache-riscv64")


def test_added_architecture_needs_its_dockerfile():
    files = edited(SCRIPT, lambda t: t.replace("  *)\n    echo \"unsupported build host",
                                             RISCV_ARM + "    echo \"unsupported build host", 1))
    with pytest.raises(ContractError) as e:
        contract(files)
    assert e.value.file == "docker/Dockerfile.gpu-rl-riscv64"
    files["docker/Dockerfile.gpu-rl-riscv64"] = files["docker/Dockerfile.gpu-rl-arm64"]
    assert "riscv64" in contract(files).script.arches


def _error(text: str) -> ContractError:
    with pytest.raises(ContractError) as e:
        parse_script(text)
    assert e.value.file == SCRIPT
    return e.value


def test_unknown_arch_setting_is_kept_and_does_not_block():
    text = script_text().replace("    CRANE_ASSET=arm64\n", "    CRANE_ASSET=arm64\n    NVCC_THREADS=4\n")
    arm = parse_script(text).arches["arm64"]
    assert arm.settings["NVCC_THREADS"] == "4" and arm.lines["NVCC_THREADS"] == line_of(text, "NVCC_THREADS=4")
    assert (arm.kaniko_platform, arm.tag_suffix) == ("linux/arm64", "-arm64")


def test_arch_table_without_reject_arm_still_reads():
    text = script_text().replace('  *)\n    echo "unsupported build host architecture: $HOST_ARCH (expected x86_64 or '
                                 'aarch64)" >&2\n    exit 2\n    ;;\n', "")
    assert set(parse_script(text).arches) == {"amd64", "arm64"}


def test_arch_arm_without_platform_column_takes_it_from_the_uname_value():
    text = script_text().replace("    KANIKO_PLATFORM=linux/arm64\n", "")
    arm = parse_script(text).arches["arm64"]
    assert (arm.kaniko_platform, arm.lines["kaniko_platform"]) == ("linux/arm64", line_of(text, "  aarch64)"))


def test_arch_arm_with_unknown_machine_and_no_platform_fails_closed_naming_the_field():
    arm = RISCV_ARM.replace("    KANIKO_PLATFORM=linux/riscv64\n", "")
    text = script_text().replace("  *)\n    echo \"unsupported build host", arm + "    echo \"unsupported build host", 1)
    err = _error(text)
    assert err.line == line_of(text, "  riscv64)") and "build platform" in str(err)
    assert "parser" in str(err) and "needs attention" in str(err)


def test_arch_arm_without_manifest_platform_is_optional():
    assert parse_script(script_text().replace("    MANIFEST_PLATFORM=linux_aarch64\n", "")).arches[
        "arm64"].manifest_platform is None


def test_token_traced_before_unset_fails():
    text = script_text().replace("unset GHCR_TOKEN\n\nset -x\n", "set -x\nunset GHCR_TOKEN\n")
    err = _error(text)
    assert "unset GHCR_TOKEN" in err.expected and err.line == line_of(text, "set -x")


def test_required_variable_under_unparsed_condition_fails():
    text = script_text().replace('if [ "$WHEEL_SOURCE" = prebuilt-wheelhouse ]; then\n  : "${PREBUILT',
                                 'if grep -q prebuilt <<<"$WHEEL_SOURCE"; then\n  : "${PREBUILT', 1)
    err = _error(text)
    assert "PREBUILT_WHEEL_ARTIFACT_URI" in err.expected and err.line == line_of(text, ': "${PREBUILT_WHEEL_ARTIFACT_URI')


def test_missing_pin_loop_fails_closed_naming_the_field():
    text = re.sub(r"for pin in \$PINNED_ARGS; do\n.*?\ndone\n", "", script_text(), flags=re.S)
    err = _error(text)
    assert "pinned ARGs" in str(err) and "needs attention" in str(err)


def test_pin_echo_without_loop_echo_still_reads_the_pins():
    text = re.sub(r'  echo "\[pin\][^\n]*\n', "", script_text())
    s = parse_script(text)
    assert s.pinned_args == ["HARBOR_COMMIT", "VLLM_FORK_COMMIT", "FLASH_ATTN_VERSION", "TORCH_VERSION"]
    assert s.pin_echo is None


def test_missing_destination_fails():
    assert "--destination" in _error(script_text().replace("--destination", "--dest")).expected


def test_empty_script_fails():
    assert _error("").line == 0


def test_script_without_any_pin_check_has_no_pins():
    text = re.sub(r"PINNED_ARGS=.*?\ndone\n", "", script_text(), flags=re.S)
    s = parse_script(text)
    assert s.pinned_args == [] and s.conditional_pinned_args == [] and s.pin_echo is None
