"""The proot isolation (rehearsal/proot.py, confine.py) really isolates, and is what runs where the pod's
default seccomp profile refuses bwrap's namespaces (Pod Security baseline), under policy.rehearsal =
"required". Each probe also runs without confinement first, so a probe that cannot fail is caught."""

from __future__ import annotations

import errno
import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from rehearsal import proot, runner
from tests.rehearsal.helpers import image_root, planned


def _need_proot():
    why = proot.unavailable()
    if why:
        pytest.skip(f"proot isolation unavailable here: {why}")


def _run(tmp_path: Path, script: str, confined: bool = True) -> subprocess.CompletedProcess:
    img = image_root()
    top = tmp_path / "top"
    top.mkdir(parents=True)
    runner._layout(top, None, "x86_64", img.path)
    argv, extra = proot.command(top, img.path, runner.OWN, ["bash", "-c", script])
    if not confined:
        argv = [os.environ.get("BASH", "/bin/bash"), "-c", script]
    return subprocess.run(argv, env={"PATH": runner.PATH + ":/usr/bin:/bin", **extra}, capture_output=True,
                          text=True, timeout=60)


@pytest.fixture()
def listener():
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    s.bind(("127.0.0.1", 0))
    s.listen(8)
    yield s.getsockname()[1]
    s.close()


def test_no_network(tmp_path, listener):
    _need_proot()
    probe = f"exec 3<>/dev/tcp/127.0.0.1/{listener} && echo TCP-OPEN; exec 4<>/dev/udp/127.0.0.1/53 && echo UDP-OPEN"
    assert "TCP-OPEN" in _run(tmp_path / "c", probe, confined=False).stdout  # the probe can reach it
    p = _run(tmp_path / "r", probe)
    assert "TCP-OPEN" not in p.stdout and "UDP-OPEN" not in p.stdout, p.stdout
    assert "socket: Permission denied" in p.stderr, p.stderr


def test_no_write_outside_its_root_and_no_worker_files_seen(tmp_path):
    _need_proot()
    outside = tmp_path / "outside.txt"
    secret = tmp_path / "worker-secret"
    secret.write_text("s3cret\n")
    worker = os.getpid()  # this test process stands for the worker: its environment holds the secrets
    probe = (f"echo x > {outside}; cat {secret}; ls /usr/bin/proot; test -e {proot.proot_path()} && echo SEEN-PROOT;"
             f" tr '\\0' '\\n' < /proc/{worker}/environ | grep -c '^PATH=' && echo SEEN-ENVIRON;"
             f" ls -l /proc/{worker}/fd/ | grep -q . && echo SEEN-FDS;"
             " echo y > /usr/lib/injected && echo WROTE-IMAGE; echo ok")
    control = _run(tmp_path / "c", probe, confined=False)
    assert outside.exists() and "s3cret" in control.stdout  # unconfined, the probe writes and reads
    assert "SEEN-ENVIRON" in control.stdout and "SEEN-FDS" in control.stdout, control.stdout
    outside.unlink()
    p = _run(tmp_path / "r", probe)
    assert p.stdout.strip().endswith("ok"), p.stderr
    assert not outside.exists() and "s3cret" not in p.stdout
    for seen in ("SEEN-PROOT", "SEEN-ENVIRON", "SEEN-FDS", "WROTE-IMAGE"):
        assert seen not in p.stdout, p.stdout
    assert not (image_root().path / "usr" / "lib" / "injected").exists()


def test_kernel_refuses_even_past_proot(tmp_path):
    """Landlock holds for whatever escapes proot's path translation: confine.py alone, no proot."""
    _need_proot()
    allowed, outside = tmp_path / "allowed", tmp_path / "outside"
    allowed.mkdir()
    argv = [*proot._confine_argv(["/"], [str(allowed)]), "/bin/bash", "-c",
            f"echo a > {allowed}/f && echo W1; echo b > {outside} && echo W2; kill -0 {os.getpid()} && echo SIG"]
    p = subprocess.run(argv, capture_output=True, text=True, timeout=30)
    assert "W1" in p.stdout and "W2" not in p.stdout and not outside.exists(), (p.stdout, p.stderr)
    assert "SIG" not in p.stdout, "a confined process could signal the worker"


def _baseline_seccomp() -> None:
    """What the runtime's default seccomp profile refuses a container without CAP_SYS_ADMIN (the pod
    under Pod Security baseline): new namespaces and mounts. Built as runc builds a profile: the
    profile's architectures added (amd64: x86_64, x86, x32; arm64: aarch64, arm), so a syscall number no
    architecture knows gets the profile's errno, not a kill."""
    import platform

    import pyseccomp as seccomp

    f = seccomp.SyscallFilter(defaction=seccomp.ALLOW)
    extra = {"x86_64": (seccomp.Arch.X86, seccomp.Arch.X32), "aarch64": (seccomp.Arch.ARM,)}
    for arch in extra.get(platform.machine(), ()):
        f.add_arch(arch)
    for name in ("unshare", "setns", "mount", "umount2", "pivot_root"):
        f.add_rule(seccomp.ERRNO(errno.EPERM), name)
    f.add_rule(seccomp.ERRNO(errno.ENOSYS), "clone3")
    ns = 0x00020000 | 0x04000000 | 0x08000000 | 0x10000000 | 0x20000000 | 0x40000000 | 0x02000000
    f.add_rule(seccomp.ERRNO(errno.EPERM), "clone", seccomp.Arg(0, seccomp.MASKED_EQ, ns, ns))
    for bit in (0x00020000, 0x04000000, 0x08000000, 0x10000000, 0x20000000, 0x40000000, 0x02000000):
        f.add_rule(seccomp.ERRNO(errno.EPERM), "clone", seccomp.Arg(0, seccomp.MASKED_EQ, bit, bit))
    f.load()


CHILD = """
import json, sys
from pathlib import Path
from domain.buildset import TargetSpec
from domain.contract import BuildContract
from rehearsal import runner
from rehearsal.task_image import TaskImages
from tests.rehearsal.test_proot_isolation import _baseline_seccomp

a = json.loads(Path(sys.argv[1]).read_text())
_baseline_seccomp()  # the pod's conditions, then the real code
targets = [TargetSpec.model_validate(t) for t in a["targets"]]
def go(accept):
    return runner.rehearse_targets(
        BuildContract.model_validate(a["contract"]), targets, bundle_path=Path(a["bundle"]),
        bundle_sha256=a["sha256"], script_text=a["script"], harbor_commit=a["harbor"], cluster_env={},
        images=TaskImages(a["cache"], mirrors=a["mirrors"], insecure_hosts=a["insecure"]), mode="required",
        isolation="auto", accept_unrehearsed=accept)
refusal = go(False)
accepted = go(True)
Path(sys.argv[2]).write_text(json.dumps({"bwrap": runner.bwrap_unavailable(), "refusal": refusal,
                                         "accepted": accepted, "accepted_refusal": accepted,
                                         "rehearsal": [t.rehearsal.model_dump() for t in targets]}))
"""


def test_under_the_baseline_seccomp_bwrap_is_refused_and_proot_rehearses_required(tmp_path):
    """The real rehearsal in a process holding the pod's seccomp refusals: bwrap's probe fails, ``auto``
    picks proot and runs the real era-C tree to its final kaniko call; under policy.rehearsal = "required"
    it rehearses fully (the final kaniko call's wait judged from the statement trace) and plans."""
    _need_proot()
    from tests.rehearsal import helpers

    contract, targets, bundle, script, harbor = planned(tmp_path, "era-c", arches=["amd64"])
    images = helpers.IMAGES
    args, out = tmp_path / "args.json", tmp_path / "result.json"
    args.write_text(json.dumps({
        "contract": contract.model_dump(mode="json"), "targets": [t.model_dump(mode="json") for t in targets],
        "bundle": str(bundle.path), "sha256": bundle.sha256, "script": script, "harbor": harbor,
        "cache": str(images.cache_dir), "mirrors": images.mirrors, "insecure": list(images.insecure_hosts)}))
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    p = subprocess.run([sys.executable, "-c", CHILD, str(args), str(out)], capture_output=True, text=True,
                       timeout=240, env=env)
    assert p.returncode == 0, p.stderr[-3000:]
    got = json.loads(out.read_text())
    assert got["bwrap"] and "cannot create an isolated root" in got["bwrap"], got["bwrap"]
    # Everything ran under proot, the final kaniko call's wait included (judged from the statement trace, no
    # /proc): 'required' plans without --accept-unrehearsed (before, this refused naming the unchecked wait).
    assert got["refusal"] is None, got["refusal"]
    assert got["accepted"] is None, got["accepted_refusal"]
    assert got["rehearsal"] and all(r["status"] == "passed" and " under proot" in r["root"]
                                    and not r["unrehearsed_from"] for r in got["rehearsal"]), got["rehearsal"]
