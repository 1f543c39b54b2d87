"""The four values a careful reading got wrong one edit away from the real era-C files (#18): each now
plans correctly (and the rehearsal confirms it up to the kaniko executor) or refuses naming file:line."""

from __future__ import annotations

import pytest

from domain.buildset import BuildSetError, parse_iris_size
from domain.contract import ContractError
from tests.rehearsal.helpers import need_isolation, planned, rehearse

SCRIPT = "docker/build_gpu_rl_kaniko.sh"
OPS = ".agents/ops/gpu-rl-image-build.md"


def _edit(old: str, new: str):
    def apply(text: str) -> str:
        assert old in text, old
        return text.replace(old, new)
    return apply


AMD64_ONLY = _edit("""  aarch64)
    CRANE_ASSET_ARCH=arm64;  KANIKO_PLATFORM=linux/arm64; WHEEL_PLATFORM_TAG=linux_aarch64
    ARCH_TAG_SUFFIX="-arm64"; DEFAULT_WHEEL_SOURCE=wheel-builder
    DEFAULT_DOCKERFILE=docker/Dockerfile.gpu-rl-arm64 ;;
""", "")
FORK_FLOATING = _edit('''DESTINATIONS=(--destination "${IMAGE_REPOSITORY}:${IMAGE_TAG}")
if [ "${PUSH_FLOATING:-0}" = "1" ]; then
  DESTINATIONS+=(--destination "${IMAGE_REPOSITORY}:${TAG_PREFIX}${ARCH_TAG_SUFFIX}")
fi''', '''FLOATING_DEST_FLAGS=(--destination "${IMAGE_REPOSITORY}:${TAG_PREFIX}${ARCH_TAG_SUFFIX}")
[ "${PUSH_FLOATING:-0}" = "1" ] || FLOATING_DEST_FLAGS=()
DESTINATIONS=("${FLOATING_DEST_FLAGS[@]}" --destination "${IMAGE_REPOSITORY}:${IMAGE_TAG}")''')
OWN_HARBOR = _edit("PINNED_ARGS=(HARBOR_COMMIT VLLM_FORK_COMMIT FLASH_ATTN_VERSION TORCH_VERSION)",
                   'HARBOR_COMMIT="${HARBOR_COMMIT:-0123456789abcdef0123456789abcdef01234567}"; '
                   "PINNED_ARGS=(VLLM_FORK_COMMIT FLASH_ATTN_VERSION TORCH_VERSION)")


def test_amd64_only_script_never_takes_the_arm64_resource_line_as_a_template(tmp_path):
    """Dropping `--cpu 48` from the amd64 line planned cpu 96 and GB200x1 from the arm64 line."""
    contract, targets, *_ = planned(tmp_path / "a", "era-c", {
        SCRIPT: AMD64_ONLY, OPS: _edit("amd64: --cpu 48 --memory 512GB", "amd64: --memory 512GB")})
    assert sorted(contract.script.arches) == ["amd64"]
    (t, *_) = targets
    assert t.job.resources.gpu is None and t.job.resources.cpu != 96
    assert t.provenance["resources.cpu"] == "config:build.architectures.amd64.cpu"
    assert any(n.startswith("line 26: the `arm64:` resource line is for an architecture the build script does "
                            "not build (amd64); ignored") for n in contract.ops.skipped), contract.ops.skipped


def test_fork_floating_array_emptied_later_plans_the_sha_tag(tmp_path):
    need_isolation()
    contract, targets, bundle, script, harbor = planned(tmp_path, "era-c", {SCRIPT: FORK_FLOATING},
                                                        arches=["amd64"], push_floating=True)
    for t in targets:
        assert t.tag == f"{'gpu-rl-megatron' if t.variant == 'megatron' else 'gpu-rl'}-{contract.commit}"
        assert t.floating_tag == ("gpu-rl-megatron" if t.variant == "megatron" else "gpu-rl")
        assert t.provenance["floating_tag"] == f"{SCRIPT}:152; flag:--push-floating"
    assert rehearse(contract, targets, bundle, script, harbor) is None
    assert all(t.rehearsal.status == "passed" for t in targets), [t.rehearsal for t in targets]
    # Without --push-floating the script empties the array: one destination, the sha tag.
    contract, targets, bundle, script, harbor = planned(tmp_path / "b", "era-c", {SCRIPT: FORK_FLOATING},
                                                        arches=["amd64"])
    assert rehearse(contract, targets, bundle, script, harbor) is None
    assert [t.rehearsal.kaniko.destinations for t in targets][0] == [f"{targets[0].image_repository}:{targets[0].tag}"]


def test_script_with_its_own_harbor_default_gets_the_build_harbor(tmp_path):
    """The service re-pins only the Dockerfile; a script-level default would have been baked instead."""
    need_isolation()
    contract, targets, bundle, script, harbor = planned(tmp_path, "era-c", {SCRIPT: OWN_HARBOR}, arches=["arm64"])
    for t in targets:
        env = {e.name: e.value for e in t.job.env}
        assert env["HARBOR_COMMIT"] == harbor != "0123456789abcdef0123456789abcdef01234567"
        assert t.provenance["env.HARBOR_COMMIT"].startswith(f"{SCRIPT}:91 reads it (default 0123456789abcdef")
    assert rehearse(contract, targets, bundle, script, harbor) is None
    assert all(t.rehearsal.kaniko.build_args["HARBOR_COMMIT"] == harbor for t in targets)
    # Had the plan not passed it, the rehearsal refuses naming both values.
    for t in targets:
        t.job.env = [e for e in t.job.env if e.name != "HARBOR_COMMIT"]
    refusal = rehearse(contract, targets, bundle, script, harbor)
    assert refusal and f"--build-arg HARBOR_COMMIT: the plan has {harbor}" in refusal
    assert "the script asked kaniko for 0123456789abcdef0123456789abcdef01234567" in refusal


@pytest.mark.parametrize("value", ["512 GB", "lots"])
def test_a_resource_value_that_is_not_a_size_refuses_naming_the_line(tmp_path, value):
    with pytest.raises(ContractError) as e:
        planned(tmp_path, "era-c", {OPS: _edit("amd64: --cpu 48 --memory 512GB", f"amd64: --cpu 48 --memory {value}")})
    assert str(e.value).startswith(f"{OPS}:25: expected a resource size such as 512GB")
    if value == "512 GB":
        assert "write it without the space, `512GB`" in str(e.value)


def test_sizes_need_a_unit():
    assert parse_iris_size("512GB") == 512 * 2**30 and parse_iris_size("1.5TB") == int(1.5 * 2**40)
    for bad in ("512", "512 GB", "lots", ""):
        with pytest.raises(BuildSetError):
            parse_iris_size(bad)
