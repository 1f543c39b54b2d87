"""The rehearsal runs each planned command against the real era-B/era-C trees and the sandbox fixture.

Real bwrap, real bash, the real scripts and bundles; only the network tools are the rehearsal's own
stand-ins (rehearsal/standins). Expectations were read from ../shared/real-marinskyrl by eye.
"""

from __future__ import annotations

import os
import tempfile

from rehearsal import runner
from rehearsal.model import PLACEHOLDER, parse_kaniko_argv, rehearsal_plan
from tests.rehearsal.helpers import image_root, need_isolation, planned, rehearse

SCRIPT = "docker/build_gpu_rl_kaniko.sh"
STALE = ["bash", "-lc", 'echo "$BUILD_B64" | base64 -d > /tmp/build.sh && exec bash /tmp/build.sh']


def _destinations(t) -> list[str]:
    return sorted([f"{t.image_repository}:{t.tag}"] + ([f"{t.image_repository}:{t.floating_tag}"]
                                                         if t.floating_tag else []))


def test_era_c_planned_command_runs_from_the_bundle_and_reaches_kaniko_for_all_four_targets(tmp_path):
    need_isolation()
    contract, targets, bundle, script, harbor = planned(tmp_path, "era-c")
    assert sorted(t.key for t in targets) == ["amd64-megatron", "amd64-standard", "arm64-megatron", "arm64-standard"]
    assert rehearse(contract, targets, bundle, script, harbor) is None
    for t in targets:
        assert t.job.command == ["bash", "-lc", f'exec bash "${{IRIS_WORKDIR:-/app}}/{SCRIPT}"']
        r = t.rehearsal
        assert r.status == "passed", r.describe()
        assert sorted(r.kaniko.destinations) == _destinations(t)
        assert r.kaniko.cache_repo == t.cache_repo == f"{t.image_repository}/cache" + (
            "-arm64" if t.architecture == "arm64" else "")
        assert r.kaniko.build_args["HARBOR_COMMIT"] == harbor and r.kaniko.build_args["GITSHA"] == contract.commit
        assert r.kaniko.build_args["INSTALL_MEGATRON"] == ("1" if t.variant == "megatron" else "0")
        assert r.kaniko.dockerfile == t.dockerfile
        # What era C fetches over the network on the way there, all stood in for:
        assert r.tools[:4] == ["uname", "apt-get", "curl", "crane"] and r.tools[-1] == "/kaniko/executor"
        # a bound against a hang, not a speed assertion (bench/rehearsal.py measures); arm64 runs emulated (qemu
        # user mode: several times the CPU, 25-35 s at load 20 on 2 cores)
        assert r.seconds < (150 if "-q qemu" in r.root else 30)


def test_era_c_stale_ops_template_fails_naming_the_line_and_stderr(tmp_path):
    """The ops doc's /tmp/build.sh launch: write_registry_auth.sh is not beside the decoded copy."""
    need_isolation()
    contract, targets, bundle, script, harbor = planned(tmp_path, "era-c", arches=["amd64"])
    t = targets[0]
    t.job.command, t.job.script_env_var = STALE, "BUILD_B64"
    refusal = rehearse(contract, [t], bundle, script, harbor)
    r = t.rehearsal
    assert r.status == "failed" and r.exit_code == 127
    assert r.line == f"{SCRIPT}:275 (run as /tmp/build.sh)"  # the `REGISTRY_USER=… bash "${SCRIPT_DIR}/…"` statement
    assert any("/tmp/write_registry_auth.sh: No such file or directory" in s for s in r.stderr_tail)
    assert refusal and f"{SCRIPT}:275" in refusal and "write_registry_auth.sh: No such file or directory" in refusal
    assert "/kaniko/executor" not in r.tools  # it died before the build step


def test_missing_write_registry_auth_fails_rehearsal_naming_the_line(tmp_path):
    need_isolation()
    contract, targets, bundle, script, harbor = planned(tmp_path, "era-c", {"docker/write_registry_auth.sh": None},
                                                        arches=["arm64"])
    refusal = rehearse(contract, targets, bundle, script, harbor)
    for t in targets:
        assert t.rehearsal.status == "failed" and t.rehearsal.line == f"{SCRIPT}:275", t.rehearsal
        assert any("/app/docker/write_registry_auth.sh: No such file or directory" in s
                   for s in t.rehearsal.stderr_tail)
    assert refusal.startswith("rehearsal of the planned job failed before anything was submitted: "
                              "arm64-standard, arm64-megatron: the script exits 127 at docker/build_gpu_rl_kaniko.sh:275")


def test_era_b_targets_pass_with_the_planned_destinations(tmp_path):
    need_isolation()
    contract, targets, bundle, script, harbor = planned(tmp_path, "era-b", push_floating=True)
    assert sorted(t.key for t in targets) == ["amd64-megatron", "amd64-standard"]  # arm64 is blocked at era B
    assert rehearse(contract, targets, bundle, script, harbor) is None
    for t in targets:
        assert t.job.script_env_var == "BUILD_B64"  # era B needs no sibling: the decoded copy runs
        assert t.rehearsal.status == "passed", t.rehearsal.describe()
        assert sorted(t.rehearsal.kaniko.destinations) == _destinations(t) and t.floating_tag


def test_sandbox_fixture_passes_rehearsal(tmp_path):
    need_isolation()
    contract, targets, bundle, script, harbor = planned(tmp_path, "fixture")
    assert rehearse(contract, targets, bundle, script, harbor,
                    cluster_env={t.cluster: {"SANDBOX_UNAME_M": "aarch64"} for t in targets
                                 if t.architecture == "arm64"}) is None
    for t in targets:
        assert t.rehearsal.status == "passed", t.rehearsal.describe()
        assert t.rehearsal.kaniko.platform == t.kaniko_platform


def test_a_difference_from_the_plan_is_refused_naming_both(tmp_path):
    need_isolation()
    contract, targets, bundle, script, harbor = planned(tmp_path, "era-c", arches=["amd64"])
    t = targets[0]
    t.tag = "gpu-rl-elsewhere"  # as if the plan had derived another tag than the script pushes
    refusal = rehearse(contract, [t], bundle, script, harbor)
    (d,) = [d for d in t.rehearsal.differences if d.field == "destinations"]
    assert d.planned == f"{t.image_repository}:gpu-rl-elsewhere" and d.planned_source == f"{SCRIPT}:151"
    assert d.script == f"{t.image_repository}:gpu-rl-{contract.commit}"
    assert "the plan has" in refusal and "the script asked kaniko for" in refusal


def test_no_real_credential_reaches_the_rehearsal_and_nothing_is_left_behind(tmp_path, monkeypatch):
    need_isolation()
    sentinel = "sentinel-registry-token-4f1c"
    monkeypatch.setenv("REGISTRY_TOKEN", sentinel)  # a worker whose own environment holds the real value
    contract, targets, bundle, script, harbor = planned(tmp_path, "era-c", arches=["amd64"])
    t = targets[0]
    plan = rehearsal_plan(t, bundle_sha256=bundle.sha256, script_b64=None, cluster_env={})
    assert plan.env["REGISTRY_TOKEN"] == PLACEHOLDER.format(secret="registry_token")
    plan.argv = ["bash", "-c", 'apt-get "$(env)"; apt-get "$(cat /proc/1/environ | tr "\\0" " ")"']
    root = image_root()
    # A private temp dir: other sessions' rehearsals on this machine create and remove theirs in /tmp meanwhile.
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "tmp"))
    (tmp_path / "tmp").mkdir()
    before = set(os.listdir(tempfile.gettempdir()))
    r = runner.run(plan, bundle.path, root)
    assert r.exit_code == 0
    seen = " ".join(a for c in r.calls for a in c.argv)
    assert "REGISTRY_TOKEN=rehearsal-placeholder-registry_token" in seen and sentinel not in seen
    assert "IRIS_TASK_ID=" in seen and "IRIS_WORKDIR=/app" in seen
    assert {p for p in set(os.listdir(tempfile.gettempdir())) - before if p.startswith("gpu-rl-rehearsal")} == set()


def test_no_network_inside_the_rehearsal(tmp_path):
    need_isolation()
    contract, targets, bundle, script, harbor = planned(tmp_path, "era-c", arches=["amd64"])
    plan = rehearsal_plan(targets[0], bundle_sha256=bundle.sha256, script_b64=None, cluster_env={})
    plan.argv = ["bash", "-c", "sed -n '3,$p' /proc/net/dev | cut -d: -f1 | tr -d ' ' >&2; exec 3<>/dev/tcp/1.1.1.1/53"]
    r = runner.run(plan, bundle.path, image_root())
    assert r.stderr.splitlines()[0] == "lo"  # the network namespace holds only the loopback device
    assert r.exit_code != 0 and "Network is unreachable" in r.stderr


def test_skipped_where_the_host_cannot_isolate(tmp_path, monkeypatch):
    contract, targets, bundle, script, harbor = planned(tmp_path, "era-c", arches=["amd64"])
    monkeypatch.setattr(runner, "bwrap_path", lambda: None)
    monkeypatch.setattr(runner.proot, "proot_path", lambda: None)
    assert rehearse(contract, targets, bundle, script, harbor, mode="best_effort", isolation="auto") is None
    (t, *_) = targets
    assert t.rehearsal.status == "skipped" and "proot is not installed" in t.rehearsal.reason
    assert t.rehearsal.describe().startswith("rehearsal skipped: bwrap is not installed")


def test_kaniko_argv_both_flag_forms():
    call = parse_kaniko_argv(["--context", "dir:///app", "--dockerfile=docker/D", "--destination", "r/x:a",
                              "--destination=r/x:b", "--cache=true", "--cache-repo=r/x/cache",
                              "--build-arg", "A=1", "--build-arg=B=2=3", "--custom-platform", "linux/arm64",
                              "--skip-unused-stages"])
    assert call.destinations == ["r/x:a", "r/x:b"] and call.cache and call.cache_repo == "r/x/cache"
    assert call.build_args == {"A": "1", "B": "2=3"} and call.platform == "linux/arm64"
    assert call.dockerfile == "docker/D" and call.context == "dir:///app"
