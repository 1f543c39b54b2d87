"""Refuse no good script (#35 item 5): one-line edits of the real era-C tree that the cluster runs fine.
Each plans (it was refused); where the rehearsal cannot tell, it says what it did not rehearse."""

from __future__ import annotations

from tests.rehearsal.helpers import need_isolation, planned, rehearse

SCRIPT = "docker/build_gpu_rl_kaniko.sh"
CRANE_CURL = 'curl -fsSL \\\n  "https://github.com/google/go-containerregistry/releases'


def _edit(old: str, new: str):
    def apply(text: str) -> str:
        assert text.count(old) == 1, old
        return text.replace(old, new)
    return apply


def test_absolute_usr_bin_curl_after_apt_installs_curl_plans(tmp_path):
    """`apt-get install curl` (stood in) then `/usr/bin/curl`: 127 "No such file" before."""
    need_isolation()
    contract, targets, bundle, script, harbor = planned(
        tmp_path, "era-c", {SCRIPT: _edit(CRANE_CURL, "/usr/bin/" + CRANE_CURL)}, arches=["amd64"])
    refusal = rehearse(contract, targets, bundle, script, harbor)
    assert refusal is None, refusal
    assert all(t.rehearsal.status == "passed" for t in targets)


def test_absolute_usr_bin_jq_without_installing_it_is_still_refused(tmp_path):
    """The control the other way: nothing installed jq, so /usr/bin/jq is missing on the cluster too."""
    need_isolation()
    contract, targets, bundle, script, harbor = planned(
        tmp_path, "era-c", {SCRIPT: _edit("cd /tmp\n", "cd /tmp\n/usr/bin/jq -n . > /dev/null\n")}, arches=["amd64"])
    refusal = rehearse(contract, targets, bundle, script, harbor)
    assert refusal and "/usr/bin/jq: No such file or directory" in refusal, refusal


ARM64_CHECK = ('echo "[arch] build host=',
               'if [ "$BUILD_ARCH" = aarch64 ]; then test -d /usr/lib/aarch64-linux-gnu; fi\necho "[arch] build host=')


def test_an_arm64_library_path_check_is_unrehearsed_not_refused_in_the_amd64_userland(tmp_path):
    """Without an emulator arm64 is rehearsed in the image's amd64 variant: the check failed and was refused.
    (With qemu it runs in the arm64 userland and passes: tests/rehearsal/test_arm64_emulation.py.)"""
    need_isolation()
    from rehearsal.task_image import host_platform
    from tests.contract.real import line_in

    if host_platform() != "linux/amd64":
        import pytest

        pytest.skip("written for an amd64 worker")
    contract, targets, bundle, script, harbor = planned(
        tmp_path, "era-c", {SCRIPT: _edit(*ARM64_CHECK)}, arches=["amd64", "arm64"])
    at = f"{SCRIPT}:{line_in('era-c', SCRIPT, 'echo \"[arch] build host=')}"
    refusal = rehearse(contract, targets, bundle, script, harbor, emulators={"arm64": ""})
    assert refusal and f"unrehearsed from {at}" in refusal and "failed before" not in refusal, refusal
    assert rehearse(contract, targets, bundle, script, harbor, accept_unrehearsed=True, emulators={"arm64": ""}) is None
    by = {t.architecture: t.rehearsal for t in targets}
    assert by["amd64"].status == "passed", by["amd64"].describe()
    assert by["arm64"].status == "skipped" and by["arm64"].unrehearsed_from == at
    assert "concerns arm64 files, and this worker rehearses in the linux/amd64 variant" in by["arm64"].reason


def test_dockerignore_leaves_a_written_credential_out_of_the_image(tmp_path):
    """The auth file written under an ignored directory of the context is not baked: it plans (the scan
    refused it), while the same write elsewhere in the context is still refused."""
    need_isolation()
    unset = "unset REGISTRY_TOKEN\n"
    write = 'mkdir -p "$DOCKER_CONTEXT/.auth"; printf "%s" "$REGISTRY_TOKEN" > "$DOCKER_CONTEXT/.auth/token"; '
    edits = {SCRIPT: _edit(unset, write + unset), ".dockerignore": lambda _: ".auth\n"}
    contract, targets, bundle, script, harbor = planned(tmp_path, "era-c", edits, arches=["amd64"])
    refusal = rehearse(contract, targets, bundle, script, harbor)
    assert refusal is None, refusal
    edits[".dockerignore"] = lambda _: ".other\n"
    contract, targets, bundle, script, harbor = planned(tmp_path / "b", "era-c", edits, arches=["amd64"])
    refusal = rehearse(contract, targets, bundle, script, harbor)
    assert refusal and "/app/.auth/token" in refusal, refusal


def test_a_copy_source_that_dockerignore_leaves_out_is_refused(tmp_path):
    """kaniko builds from the context less what .dockerignore names: `COPY cloud` of an ignored cloud/ fails."""
    need_isolation()
    from tests.contract.real import line_in

    df = "docker/Dockerfile.gpu-rl"
    contract, targets, bundle, script, harbor = planned(
        tmp_path, "era-c", {".dockerignore": lambda _: "# not in the image\ncloud\n"}, arches=["amd64"])
    refusal = rehearse(contract, targets, bundle, script, harbor)
    at = f"{df}:{line_in('era-c', df, 'COPY cloud ${SKYRL_HOME}/cloud')}"
    assert refusal and f"{at}: `COPY` of cloud: not in the build context" in refusal, refusal


def test_dockerignore_patterns_follow_docker():
    from rehearsal.model import dockerignore

    left_out = dockerignore("# comment\ncloud\n**/*.tmp\n!keep.tmp\n/docs/*.md\n")
    for path, want in [("cloud", True), ("cloud/x/y", True), ("clouds", False), ("a/b/c.tmp", True),
                       ("c.tmp", True), ("keep.tmp", False), ("docs/a.md", True), ("docs/x/a.md", False)]:
        assert left_out(path) is want, path
