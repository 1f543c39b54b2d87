"""arm64 rehearsed in the arm64 userland (#35 item 5): qemu user mode under proot, no privileges.

The stand-in task image has a linux/arm64 variant made of Debian's arm64 packages (sandbox/task_image.py);
an arm64 target runs it through ``proot -q qemu-aarch64-static`` (rehearsal/emulation.py), confined by
Landlock and seccomp as any proot run. Each edit is one line of a real tree; lines are found by their text.
"""

from __future__ import annotations

import os
import re

import pytest

from rehearsal import emulation, proot
from sandbox.task_image import FOREIGN_UNAVAILABLE, platforms
from tests.contract.real import REAL, line_in
from tests.rehearsal.helpers import need_isolation, planned, rehearse

SCRIPT = "docker/build_gpu_rl_kaniko.sh"
ANCHOR = 'echo "[arch] build host='  # era C's first line after the `uname -m` table


def need_emulation() -> None:
    need_isolation()
    why = emulation.emulator("arm64")[1] or proot.unavailable()
    if why is None and "arm64" not in platforms():
        why = f"the stand-in task image has no arm64 variant: {FOREIGN_UNAVAILABLE.get('arm64')}"
    if why:
        pytest.skip(f"arm64 emulation unavailable here: {why}")


def _insert(before: str, line: str):
    def apply(text: str) -> str:
        assert text.count(before) == 1, before
        return text.replace(before, line + "\n" + before)
    return apply


def _at(era: str, needle: str = ANCHOR) -> str:
    return f"{SCRIPT}:{line_in(era, SCRIPT, needle)}"  # the inserted line takes the needle's old number


# Three statements (not an && list, whose failure `set -e` ignores): the image's own uname, not the stand-in.
ARCH_CHECKS = ('if [ "$BUILD_ARCH" = aarch64 ]; then test -d /usr/lib/aarch64-linux-gnu; '
               'test "$(dpkg --print-architecture)" = arm64; test "$(/usr/bin/uname -m)" = aarch64; fi')


def _era_b_arm64_plannable(text: str) -> str:
    """era B's arm64 Dockerfile lacks a pin its script checks on every build (the planner refuses arm64 from
    the unmodified tree: the script would exit 2), and pins another Harbor than the amd64 one, which its script
    reads on every host (the service re-pins both to one Harbor in the build commit): declare the pin and
    re-pin Harbor as the service does."""
    amd64 = (REAL / "era-b" / "docker" / "Dockerfile.gpu-rl").read_text()
    harbor = re.search(r"^ARG HARBOR_COMMIT=(\S+)$", amd64, re.M).group(1)
    donor = re.search(r"^ARG VLLM_NATIVE_DONOR_COMMIT=\S+$", amd64, re.M).group(0)
    text = re.sub(r"^ARG HARBOR_COMMIT=\S+$", f"ARG HARBOR_COMMIT={harbor}", text, count=1, flags=re.M)
    return _insert("ARG VLLM_FORK_COMMIT=", donor)(text)


@pytest.mark.parametrize("era", ["era-c", "era-b"])
def test_unmodified_real_trees_plan_for_arm64_in_the_arm64_userland(tmp_path, era):
    """The control: under `required`, no --accept-unrehearsed; the root is the arm64 variant, emulated.
    (era B: with its arm64 Dockerfile's missing pin declared, without which arm64 is not planned at all.)"""
    need_emulation()
    edits = {"docker/Dockerfile.gpu-rl-arm64": _era_b_arm64_plannable} if era == "era-b" else None
    contract, targets, bundle, script, harbor = planned(tmp_path, era, edits, arches=["arm64"])
    assert targets
    assert rehearse(contract, targets, bundle, script, harbor, mode="required") is None
    for t in targets:
        r = t.rehearsal
        assert r.status == "passed" and not r.unrehearsed_from, r.describe()
        assert "(linux/arm64," in r.root and "under proot -q qemu-aarch64-static" in r.root, r.root
        assert "variant:" not in r.root, r.root


def test_arm64_steps_see_the_arm64_userland_and_the_same_edit_passes_for_amd64(tmp_path):
    """A library-path, dpkg and real-`uname -m` check for aarch64 (unrehearsed before: it ran in the amd64
    userland) now runs and passes; amd64 skips the branch and passes too."""
    need_emulation()
    contract, targets, bundle, script, harbor = planned(
        tmp_path, "era-c", {SCRIPT: _insert(ANCHOR, ARCH_CHECKS)}, arches=["amd64", "arm64"])
    refusal = rehearse(contract, targets, bundle, script, harbor)
    assert refusal is None, refusal
    for t in targets:
        assert t.rehearsal.status == "passed" and not t.rehearsal.unrehearsed_from, t.rehearsal.describe()


def test_the_arm64_steps_really_run_in_the_emulated_userland(tmp_path):
    """The same checks inverted (the amd64 library directory on an aarch64 host) fail: they are run."""
    need_emulation()
    wrong = ARCH_CHECKS.replace("/usr/lib/aarch64-linux-gnu", "/usr/lib/x86_64-linux-gnu")
    contract, targets, bundle, script, harbor = planned(
        tmp_path, "era-c", {SCRIPT: _insert(ANCHOR, wrong)}, arches=["arm64"])
    refusal = rehearse(contract, targets, bundle, script, harbor)
    assert refusal and "failed before" in refusal and _at("era-c") in refusal, refusal


def test_a_broken_arm64_only_step_is_refused_naming_the_line_and_amd64_is_unaffected(tmp_path):
    """One edit: a typo in the arm64 library-path check. arm64 is refused naming the file and line (it was
    "unrehearsed" before: rehearsed in the amd64 userland); amd64 passes with the same edit."""
    need_emulation()
    broken = 'if [ "$BUILD_ARCH" = aarch64 ]; then test -d /usr/lib/aarch64-linux-gnux; fi'
    contract, targets, bundle, script, harbor = planned(
        tmp_path, "era-c", {SCRIPT: _insert(ANCHOR, broken)}, arches=["amd64", "arm64"])
    refusal = rehearse(contract, targets, bundle, script, harbor)
    at = _at("era-c")
    assert refusal and "failed before" in refusal and at in refusal and "unrehearsed" not in refusal, refusal
    for t in targets:
        r = t.rehearsal
        if t.architecture == "arm64":
            assert r.status == "failed" and r.line == at and r.exit_code == 1, r.describe()
        else:
            assert r.status == "passed", r.describe()
            assert t.key not in refusal


def test_without_qemu_the_arch_specific_step_is_unrehearsed_not_refused(tmp_path):
    """policy.rehearsal_emulators pointing at a missing qemu: the amd64 variant, the arm64 check unrehearsed
    (refused under `required` unless acknowledged), the reason names the setting."""
    need_isolation()
    missing = {"arm64": str(tmp_path / "no-such" / "qemu-aarch64-static")}
    contract, targets, bundle, script, harbor = planned(
        tmp_path, "era-c", {SCRIPT: _insert(ANCHOR, ARCH_CHECKS)}, arches=["arm64"])
    at = _at("era-c")
    refusal = rehearse(contract, targets, bundle, script, harbor, emulators=missing)
    assert refusal and f"unrehearsed from {at}" in refusal and "failed before" not in refusal, refusal
    assert rehearse(contract, targets, bundle, script, harbor, emulators=missing, accept_unrehearsed=True) is None
    r = targets[0].rehearsal
    assert r.status == "skipped" and r.unrehearsed_from == at, r.describe()
    assert "policy.rehearsal_emulators.arm64" in r.reason and "is not installed" in r.reason, r.reason
    assert "(linux/amd64," in r.root, r.root


def test_explicit_bwrap_does_not_emulate_and_says_why(tmp_path):
    """bwrap cannot run arm64 programs without binfmt_misc: with isolation = "bwrap" the arm64 check is
    unrehearsed, naming the setting and what runs it (auto or proot)."""
    need_emulation()
    from rehearsal import runner

    if runner.bwrap_unavailable():
        pytest.skip("bwrap cannot run here")
    contract, targets, bundle, script, harbor = planned(
        tmp_path, "era-c", {SCRIPT: _insert(ANCHOR, ARCH_CHECKS)}, arches=["arm64"])
    assert rehearse(contract, targets, bundle, script, harbor, isolation="bwrap", accept_unrehearsed=True) is None
    r = targets[0].rehearsal
    assert r.status == "skipped" and r.unrehearsed_from == _at("era-c"), r.describe()
    assert 'policy.rehearsal_isolation = "bwrap"' in r.reason and "proot -q" in r.reason, r.reason


HIDDEN = ("Permission denied", "No such file or directory")


@pytest.mark.parametrize("line, says", [
    ("echo probe > /dev/tcp/127.0.0.1/80", ("Permission denied",)),  # seccomp: qemu's host socket(AF_INET) -> EACCES
    ("cat /host-rootfs/etc/hostname", HIDDEN),  # Landlock (or proot's binding absent)
    ("touch /host-rootfs/tmp/gpu-rl-escaped", HIDDEN),
])
def test_the_confinement_holds_under_emulation(tmp_path, line, says):
    """qemu issues the host's x86_64 syscalls for the guest's: the x86_64 seccomp filter and Landlock see
    them. proot -q shows the worker's root at /host-rootfs; Landlock keeps it unreadable and unwritable."""
    need_emulation()
    contract, targets, bundle, script, harbor = planned(
        tmp_path, "era-c", {SCRIPT: _insert(ANCHOR, line)}, arches=["arm64"])
    refusal = rehearse(contract, targets, bundle, script, harbor)
    assert refusal and "failed before" in refusal and _at("era-c") in refusal, refusal
    r = targets[0].rehearsal
    assert "under proot -q" in r.root and any(w in s for s in r.stderr_tail for w in says), r.stderr_tail
    assert not os.path.exists("/tmp/gpu-rl-escaped")


def test_the_stand_ins_run_natively_and_those_that_run_an_image_program_stay_emulated(tmp_path):
    """In an emulated run the stand-ins run on the worker's static bash (an exec under qemu costs 50-90 ms of
    CPU), but uname/python3/python/git, which may exec the image's own program, stay on the image's bash."""
    need_emulation()
    if emulation.host_tools() is None:
        pytest.skip("bash-static or busybox-static is not installed here")
    from rehearsal import runner
    from rehearsal.model import STANDIN_TOOLS
    from tests.rehearsal import helpers

    arm64 = helpers.IMAGES.root(helpers.TASK_IMAGE, "linux/arm64", emulator=emulation.emulator("arm64")[0]).path
    top = tmp_path / "run"
    runner._layout(top, None, "aarch64", arm64, native=True)
    bin_dir = top / "rehearsal" / "bin"
    for tool in STANDIN_TOOLS:
        want = "standin" if tool in emulation.GUEST_STANDINS else "standin-host"
        assert os.readlink(bin_dir / tool) == want, tool
    assert (bin_dir / "standin").read_bytes().startswith(b"#!/bin/bash -p\n")
    for native in (bin_dir / "standin-host", top / "kaniko" / "executor"):
        assert native.read_bytes().startswith(f"#!{emulation.HOST_DIR}/bash -p\n".encode()), native
    assert emulation.static_host_elf(str(top / "rehearsal" / "host" / "bash"))
    assert not emulation.static_host_elf(str(arm64 / "usr" / "bin" / "bash"))
    assert not emulation.static_host_elf("/usr/bin/env")  # dynamically linked


def test_a_program_a_stand_in_runs_gets_the_scripts_environment(tmp_path):
    """`git status` runs the image's git through the git stand-in (here a guest script behind the stand-ins on
    PATH, which exits 1 if LD_LIBRARY_PATH is set). A guest program exec'd by a native one gets the worker's
    library path from proot (mixed mode), and under Landlock proot cannot even start it (its "glue rootfs"): the
    git stand-in stays on the image's bash, so the image's git runs with the script's environment. (Routed to
    the native stand-in, git fails here: checked when the routing was written.)"""
    need_emulation()
    probe = ("mkdir -p /tmp/img-bin; printf '#!/bin/sh\\n[ -z \"${LD_LIBRARY_PATH+set}\" ]\\n' > /tmp/img-bin/git; "
             "chmod +x /tmp/img-bin/git; PATH=$PATH:/tmp/img-bin; git status")
    contract, targets, bundle, script, harbor = planned(
        tmp_path, "era-c", {SCRIPT: _insert(ANCHOR, probe)}, arches=["arm64"])
    refusal = rehearse(contract, targets, bundle, script, harbor)
    assert refusal is None, refusal
    r = targets[0].rehearsal
    assert r.status == "passed" and "under proot -q" in r.root, r.describe()


def test_a_backgrounded_kaniko_is_refused_under_emulation(tmp_path):
    """The kaniko stand-in runs natively in an emulated run; whether the script waited for it is judged as
    before (runner._not_waited): `exec kaniko … &`, other work, `exit 0` is refused."""
    need_emulation()
    last, call = '  "${DESTINATIONS[@]}"\n', "exec /kaniko/executor"

    def edit(text: str) -> str:
        return text.replace(last, last.rstrip("\n") + " &\necho built\nsleep 1\nexit 0\n")

    contract, targets, bundle, script, harbor = planned(tmp_path, "era-c", {SCRIPT: edit}, arches=["arm64"])
    refusal = rehearse(contract, targets, bundle, script, harbor)
    at = f"{SCRIPT}:{line_in('era-c', SCRIPT, call)}"
    assert refusal and targets[0].rehearsal.status == "failed", targets[0].rehearsal.describe()
    assert f"the kaniko call at {at} was still running when the script exited" in refusal, refusal
    assert "under proot -q" in targets[0].rehearsal.root


UNSET = "unset REGISTRY_TOKEN\n"
ON_ARM64 = 'if [ "$(dpkg --print-architecture)" = arm64 ]; then {}; fi; '


def _before_unset(text: str):
    def apply(s: str) -> str:
        assert s.count(UNSET) == 1
        return s.replace(UNSET, text + UNSET)
    return {SCRIPT: apply}


def test_the_second_placeholder_run_goes_native_only_when_it_changes_nothing(tmp_path):
    """The unmodified tree: the run with the other placeholders ran in the worker's own variant, natively
    (runner._run_twice), and left the same context as the emulated run."""
    need_emulation()
    contract, targets, bundle, script, harbor = planned(tmp_path, "era-c", arches=["arm64"])
    assert rehearse(contract, targets, bundle, script, harbor) is None
    r = targets[0].rehearsal
    assert r.status == "passed" and "under proot -q" in r.root, r.describe()
    assert "the run with other placeholders (linux/amd64, natively) left the same context" in r.root, r.root


def test_a_context_file_that_differs_by_architecture_only_plans(tmp_path):
    """`dpkg --print-architecture` written into the context: arm64 in the emulated run, amd64 in the native
    second run. That difference is the userland's, not the credential's: the second run is made again emulated
    and the two agree. (Judged from the native run, the file would be refused as following the credential.)"""
    need_emulation()
    contract, targets, bundle, script, harbor = planned(
        tmp_path, "era-c", _before_unset('dpkg --print-architecture > "$DOCKER_CONTEXT/docker/arch"; '),
        arches=["arm64"])
    refusal = rehearse(contract, targets, bundle, script, harbor)
    assert refusal is None, refusal
    r = targets[0].rehearsal
    assert r.status == "passed" and "natively" not in r.root, r.describe()


def test_a_credential_written_on_arm64_only_is_found_by_difference(tmp_path):
    """The token, base32-encoded, written into the context only where dpkg says arm64: the native second run
    does not write it, so the second run is made again emulated, and the file is refused naming the line."""
    need_emulation()
    leak = ON_ARM64.format('printf "%s" "$REGISTRY_TOKEN" | base32 > "$DOCKER_CONTEXT/docker/leak"')
    contract, targets, bundle, script, harbor = planned(tmp_path, "era-c", _before_unset(leak), arches=["arm64"])
    refusal = rehearse(contract, targets, bundle, script, harbor)
    at = f"{SCRIPT}:{line_in('era-c', SCRIPT, UNSET.strip())}"
    named = "/app/docker/leak changes with the credential (rehearsed twice with different placeholder credentials)"
    assert refusal and named in refusal, refusal
    after = refusal.split(named, 1)[1]
    assert not after.startswith(", written at") or after.startswith(f", written at {at}"), refusal
    assert targets[0].rehearsal.status == "failed", targets[0].rehearsal.describe()
