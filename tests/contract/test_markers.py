"""Expected markers from the contract, and check_log against logs — including a real build run.

The end-to-end test runs the fixture's real build script with the sandbox kaniko stand-in against a
real local docker-registry (htpasswd auth), then checks the produced log with the derived markers.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from domain.markers import check_log, expected_markers

from .helpers import COMMIT, FIXTURE, HARBOR, contract

REPO = "ghcr.io/marin-community/marinskyrl"


def names(markers):
    return [m.text or m.pattern for m in markers]


def test_standard_and_megatron_sets_differ():
    c = contract()
    std = names(expected_markers(c, "amd64", "standard", "wheel-builder", f"gpu-rl-{COMMIT}"))
    meg = names(expected_markers(c, "amd64", "megatron", "wheel-builder", f"gpu-rl-megatron-{COMMIT}"))
    assert "torchtitan ExpertParallel import OK (apply_ep EP>1 unblocked)" in std
    assert "megatron backend not installed (INSTALL_MEGATRON=0)" in std
    assert "Megatron native imports OK" in meg and "Megatron native imports OK" not in std
    assert "FSDP torchtitan backend not installed (INSTALL_MEGATRON=1)" in meg
    assert "transformer_engine.pytorch + megatron.bridge AutoBridge import OK" not in meg  # arm64 only
    arm = names(expected_markers(c, "arm64", "megatron", "wheel-builder", f"gpu-rl-megatron-{COMMIT}-arm64"))
    assert "transformer_engine.pytorch + megatron.bridge AutoBridge import OK" in arm
    assert "uv sync FINAL (vllm, cufft, triton, nvshmem, nvrtc + closure verify) done (megatron=1)" in meg
    assert "uv sync FINAL (vllm, cufft, triton, nvshmem, nvrtc + closure verify) done (megatron=0)" in std


def test_script_markers_follow_the_path():
    c = contract()
    wb = names(expected_markers(c, "amd64", "standard", "wheel-builder", f"gpu-rl-{COMMIT}"))
    assert f"[pin] HARBOR_COMMIT={HARBOR} (from docker/Dockerfile.gpu-rl)" in wb
    assert not any("VLLM_NATIVE_DONOR_COMMIT" in n for n in wb)
    assert f"preserved wheel-builder stage as {REPO}:wheels-{COMMIT}" in wb
    assert "validated and staged prebuilt vLLM wheelhouse" not in wb
    pre = names(expected_markers(c, "amd64", "standard", "prebuilt-wheelhouse", f"gpu-rl-{COMMIT}"))
    assert "validated and staged prebuilt vLLM wheelhouse" in pre
    assert any(n.startswith("[pin] VLLM_NATIVE_DONOR_COMMIT=") for n in pre)
    assert not any(n.startswith("preserved wheel-builder") for n in pre)
    assert f"baked harbor commit: {HARBOR}" in wb
    assert any(n.startswith("[arch] build host=x86_64 kaniko=linux/amd64 wheels=wheel-builder tag-suffix=none")
               for n in wb)


def _log(markers, digest="d" * 64, drop: str | None = None, push=True):
    lines = []
    for m in markers:
        if m.role != "assert" or (drop and (m.text or "").startswith(drop)):
            continue
        lines.append(m.text if m.text else m.name.replace("…", "x1"))
    lines.append(f"INFO[0001] Pushing image to {REPO}:wheels-{COMMIT}")
    lines.append(f"INFO[0002] Pushed {REPO}@sha256:{'e' * 64}")
    if push:
        lines.append(f"INFO[0003] Pushing image to {REPO}:gpu-rl-{COMMIT}")
        lines.append(f"INFO[0004] Pushed {REPO}@sha256:{digest}")
    return "\n".join(lines) + "\n"


def test_check_log_found_missing_and_digest():
    c = contract()
    markers = expected_markers(c, "amd64", "standard", "wheel-builder", f"gpu-rl-{COMMIT}")
    ok = check_log(markers, _log(markers))
    assert ok.missing == [] and ok.final_push_seen and ok.pushed_digest == "sha256:" + "d" * 64
    bad = check_log(markers, _log(markers, drop="memray OK"))
    assert bad.missing == ["memray OK"] and bad.final_push_seen


def test_wheels_push_alone_is_not_the_final_push():
    c = contract()
    markers = expected_markers(c, "amd64", "standard", "wheel-builder", f"gpu-rl-{COMMIT}")
    res = check_log(markers, _log(markers, push=False))
    assert not res.final_push_seen and res.pushed_digest is None
    assert f"push {REPO}:gpu-rl-{COMMIT}" in res.missing


@pytest.mark.parametrize(("arch", "variant", "uname"), [("amd64", "standard", "x86_64"),
                                                       ("arm64", "megatron", "aarch64")])
def test_real_build_log_satisfies_markers(tmp_path: Path, htpasswd_registry, arch, variant, uname):
    if shutil.which("bash") is None:
        pytest.skip("bash not available")
    app = tmp_path / "app"
    shutil.copytree(FIXTURE, app)
    for p in app.rglob("*"):
        if p.is_file() and p.suffix in ("", ".sh", ".py", ".md", ".gpu-rl", ".gpu-rl-arm64"):
            try:
                p.write_text(p.read_text().replace("{{HARBOR_COMMIT}}", HARBOR))
            except UnicodeDecodeError:
                pass
    user, token = htpasswd_registry.credentials
    repo = f"{htpasswd_registry.host}/marin-community/marinskyrl"
    c = contract()
    env = {"PATH": os.environ["PATH"], "HOME": str(tmp_path), "GITSHA": COMMIT, "DOCKER_USER_ID": user,
           "GHCR_TOKEN": token, "IRIS_WORKDIR": str(app), "IRIS_TASK_ID": "test-task",
           "GHCR_IMAGE_REPOSITORY": repo, "WHEEL_SOURCE": "wheel-builder", "SANDBOX_UNAME_M": uname}
    tag_prefix = "gpu-rl"
    if variant == "megatron":
        env.update({e.name: e.value for e in c.ops.megatron_env})
        tag_prefix = env["TAG_PREFIX"]
    tag = f"{tag_prefix}-{COMMIT}{c.arch(arch).tag_suffix}"
    proc = subprocess.run(["bash", str(app / "docker/build_gpu_rl_kaniko.sh")], env=env, cwd=tmp_path,
                          capture_output=True, text=True, timeout=240)
    log = proc.stdout + proc.stderr
    assert proc.returncode == 0, log[-3000:]
    assert token not in log
    markers = expected_markers(c, arch, variant, "wheel-builder", tag, image_repository=repo)
    res = check_log(markers, log)
    assert res.missing == [], res.missing
    assert res.final_push_seen and res.pushed_digest and res.pushed_digest.startswith("sha256:")
    # the other variant's exclusive markers are absent from this log
    other = expected_markers(c, arch, "standard" if variant == "megatron" else "megatron", "wheel-builder",
                             tag, image_repository=repo)
    assert check_log(other, log).missing
