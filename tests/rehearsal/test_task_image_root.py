"""The rehearsal runs in the planned task image's userland and finds the bundle as Iris leaves it.

Real bwrap, the real era-B/era-C scripts, a real registry holding the stand-in ubuntu:22.04
(sandbox/task_image.py: bash, coreutils, apt-get, ... and deliberately no jq, python3, curl). Each edit
is one line of the real script; the expected line is found by its text, not hard-coded.
"""

from __future__ import annotations

from rehearsal import runner
from rehearsal.task_image import TaskImages, host_platform
from sandbox.task_image import mirrors_for, push_task_image
from tests.contract.real import line_in
from tests.rehearsal.helpers import TASK_IMAGE, need_isolation, planned, rehearse

SCRIPT = "docker/build_gpu_rl_kaniko.sh"
APT_C = 'apt-get update -y'


def _before(needle: str, line: str):
    """An edit inserting ``line`` before the first line holding ``needle``."""
    def edit(text: str) -> str:
        i = text.index(needle)
        return text[:i] + line + "\n" + text[i:]
    return edit


def _line_after_insert(era: str, needle: str) -> int:
    return line_in(era, SCRIPT, needle)  # the inserted line takes the needle's old number


def test_era_c_jq_before_installing_it_is_refused_naming_the_line(tmp_path):
    need_isolation()
    edit = {SCRIPT: _before(APT_C, 'jq -n \'{"arch": "x"}\' > /tmp/arch.json')}
    contract, targets, bundle, script, harbor = planned(tmp_path, "era-c", edit, arches=["amd64"])
    refusal = rehearse(contract, targets, bundle, script, harbor)
    line = f"{SCRIPT}:{_line_after_insert('era-c', APT_C)}"
    for t in targets:
        r = t.rehearsal
        assert r.status == "failed" and r.exit_code == 127 and r.line == line, r.describe()
        assert any("jq: command not found" in s for s in r.stderr_tail), r.stderr_tail
    assert refusal and line in refusal and "jq: command not found" in refusal


def test_era_c_jq_after_installing_it_passes(tmp_path):
    """The same call after `apt-get install jq`: the stood-in install provides it (no false refusal)."""
    need_isolation()
    install = 'apt-get install -y --no-install-recommends "${APT_PACKAGES[@]}"'
    edit = {SCRIPT: lambda s: s.replace(install, install + " jq\njq -n '{}' > /tmp/arch.json", 1)}
    contract, targets, bundle, script, harbor = planned(tmp_path, "era-c", edit, arches=["amd64"])
    assert rehearse(contract, targets, bundle, script, harbor) is None
    for t in targets:
        assert t.rehearsal.status == "passed", t.rehearsal.describe()
        assert "jq" in t.rehearsal.tools and TASK_IMAGE in t.rehearsal.root


def test_era_b_python3_before_installing_it_is_refused_naming_the_line(tmp_path):
    need_isolation()
    needle = "apt-get update -y"
    edit = {SCRIPT: _before(needle, 'python3 -c "import platform; print(platform.machine())"')}
    contract, targets, bundle, script, harbor = planned(tmp_path, "era-b", edit)
    refusal = rehearse(contract, targets, bundle, script, harbor)
    line = f"{SCRIPT}:{_line_after_insert('era-b', needle)}"
    assert {t.key for t in targets} == {"amd64-standard", "amd64-megatron"}
    for t in targets:
        r = t.rehearsal
        assert r.status == "failed" and r.exit_code == 127, r.describe()
        assert r.line.startswith(line + " (run as "), r.line  # era B runs the decoded copy of the script
        assert any("python3: command not found" in s for s in r.stderr_tail), r.stderr_tail
    assert refusal and line in refusal


def test_era_c_sibling_script_run_directly_is_refused_as_iris_would_fail_it(tmp_path):
    """Committed executable (the zip carries 0755), but Iris extracts the bundle without zip mode bits:
    write_registry_auth.sh is 0644 in the task."""
    need_isolation()
    call = 'bash "${SCRIPT_DIR}/write_registry_auth.sh"'
    edit = {SCRIPT: lambda s: s.replace(call, '"${SCRIPT_DIR}/write_registry_auth.sh"', 1)}
    contract, targets, bundle, script, harbor = planned(tmp_path, "era-c", edit, arches=["amd64"],
                                                        executable=("docker/write_registry_auth.sh",))
    import zipfile

    with zipfile.ZipFile(bundle.path) as z:  # the bundle does carry the executable bit
        assert z.getinfo("docker/write_registry_auth.sh").external_attr >> 16 & 0o111
    refusal = rehearse(contract, targets, bundle, script, harbor)
    line = f"{SCRIPT}:{line_in('era-c', SCRIPT, 'REGISTRY_USER=\"$REGISTRY_USER\" REGISTRY_TOKEN')}"
    for t in targets:
        r = t.rehearsal
        assert r.status == "failed" and r.exit_code == 126 and r.line == line, r.describe()
        assert any("write_registry_auth.sh: Permission denied" in s for s in r.stderr_tail), r.stderr_tail
    assert refusal and line in refusal


def test_required_without_isolation_refuses_naming_the_setting(tmp_path, monkeypatch):
    contract, targets, bundle, script, harbor = planned(tmp_path, "era-c", arches=["amd64"])
    monkeypatch.setattr(runner, "bwrap_path", lambda: None)
    monkeypatch.setattr(runner.proot, "proot_path", lambda: None)
    refusal = rehearse(contract, targets, bundle, script, harbor, mode="required", isolation="auto")
    assert refusal and 'policy.rehearsal = "required"' in refusal and "bwrap is not installed" in refusal
    assert "proot is not installed" in refusal
    assert "nothing was submitted" in refusal and all(t.rehearsal is None for t in targets)
    assert rehearse(contract, targets, bundle, script, harbor, mode="best_effort", isolation="auto") is None
    assert all(t.rehearsal.describe().startswith("rehearsal skipped: bwrap is not installed") for t in targets)


def test_required_refuses_when_the_host_cannot_create_namespaces(tmp_path, monkeypatch):
    """A bwrap that exists but is refused by the host (as under seccomp RuntimeDefault): its own error."""
    contract, targets, bundle, script, harbor = planned(tmp_path, "era-c", arches=["amd64"])
    fake = tmp_path / "bwrap"
    fake.write_text("#!/bin/sh\necho 'bwrap: No permissions to create new namespace' >&2\nexit 1\n")
    fake.chmod(0o755)
    monkeypatch.setattr(runner, "bwrap_path", lambda: str(fake))
    monkeypatch.setattr(runner.proot, "proot_path", lambda: None)
    refusal = rehearse(contract, targets, bundle, script, harbor, mode="required", isolation="auto")
    assert 'policy.rehearsal = "required"' in refusal and "No permissions to create new namespace" in refusal


def test_task_image_is_cached_by_manifest_digest(tmp_path, open_registry):
    repo = "rehearsal-cache/ubuntu"
    push_task_image(open_registry.host, repository=repo, tag="22.04")
    ref = f"docker.io/{repo}:22.04"

    def images() -> TaskImages:  # a fresh client on the same cache, as after a worker restart
        return TaskImages(tmp_path / "cache", mirrors=mirrors_for(open_registry.host),
                          insecure_hosts=[open_registry.host])

    first = images().root(ref, "linux/amd64")
    assert first.downloaded_bytes > 0 and (first.path / "usr" / "bin" / "bash").is_file()
    assert not (first.path / "usr" / "bin" / "jq").exists()
    again = images().root(ref, "linux/amd64")
    assert again.downloaded_bytes == 0 and again.path == first.path and again.digest == first.digest
    # A tag that moves to other content gets its own root; the old digest's root is left as it was.
    (first.path / "etc" / "marker").write_text("old")
    push_task_image(open_registry.host, repository=repo, tag="22.04", note="rebuilt")
    moved = images().root(ref, "linux/amd64")
    assert moved.digest != first.digest and moved.downloaded_bytes > 0 and moved.path != first.path
    assert (first.path / "etc" / "marker").read_text() == "old"
    assert not (moved.path / "etc" / "marker").exists()


def test_a_target_the_worker_cannot_execute_rehearses_in_the_host_variant_and_says_so(tmp_path):
    """Without an emulator (policy.rehearsal_emulators names none; with one: test_arm64_emulation.py)."""
    need_isolation()
    if host_platform() != "linux/amd64":
        import pytest

        pytest.skip("written for an amd64 worker")
    contract, targets, bundle, script, harbor = planned(tmp_path, "era-c", arches=["amd64", "arm64"])
    assert rehearse(contract, targets, bundle, script, harbor, emulators={"arm64": ""}) is None
    for t in targets:
        # passed: kaniko's platform (era C's follows `uname -m`, stood in for) is the planned one
        assert t.rehearsal.status == "passed", t.rehearsal.describe()
        note = "linux/amd64 variant: this worker cannot execute linux/arm64 binaries"
        assert (note in t.rehearsal.root) == (t.architecture == "arm64"), t.rehearsal.root
        assert note in t.rehearsal.describe() or t.architecture == "amd64"


def test_the_stand_ins_come_back_after_a_profile_resets_path(tmp_path):
    """Debian's /etc/profile sets root's PATH in a login shell; the scripts it runs still get the stand-ins."""
    need_isolation()
    from rehearsal.model import rehearsal_plan
    from tests.rehearsal.helpers import image_root

    contract, targets, bundle, script, harbor = planned(tmp_path, "era-c", arches=["arm64"])
    plan = rehearsal_plan(targets[0], bundle_sha256=bundle.sha256, script_b64=None, cluster_env={})
    plan.argv = ["bash", "-c", 'PATH=/usr/sbin:/usr/bin:/sbin:/bin; exec bash -c "uname -m >&2"']
    r = runner.run(plan, bundle.path, image_root())
    assert r.exit_code == 0 and r.stderr.split() == ["aarch64"], r.stderr  # the stand-in, not the host's uname


def test_an_unpullable_task_image_refuses_naming_it_and_an_unreachable_registry_is_transient(tmp_path,
                                                                                           open_registry):
    import pytest

    from rehearsal.task_image import TaskImageError

    need_isolation()
    missing = TaskImages(tmp_path / "c1", mirrors={"docker.io": open_registry.host},
                         insecure_hosts=[open_registry.host], max_retries=0)
    with pytest.raises(TaskImageError) as e:
        missing.root("docker.io/library/no-such-image:1", "linux/amd64")
    assert not e.value.transient and "cannot be pulled anonymously" in str(e.value)
    contract, targets, bundle, script, harbor = planned(tmp_path, "era-c", arches=["amd64"])
    for t in targets:
        t.job.task_image = "docker.io/library/no-such-image:1"
    refusal = rehearse(contract, targets, bundle, script, harbor, images=missing)
    assert 'policy.rehearsal = "required"' in refusal and "no-such-image:1" in refusal
    assert f"task_image from {targets[0].provenance['task_image']}" in refusal
    assert rehearse(contract, targets, bundle, script, harbor, mode="best_effort", images=missing) is None
    assert all(t.rehearsal.status == "skipped" and "no-such-image" in t.rehearsal.reason for t in targets)
    down = TaskImages(tmp_path / "c2", mirrors={"docker.io": "127.0.0.1:9"}, insecure_hosts=["127.0.0.1:9"],
                      max_retries=0)
    with pytest.raises(TaskImageError) as e:  # for the plan activity's bounded retry
        rehearse(contract, targets, bundle, script, harbor, images=down)
    assert e.value.transient
