"""kubectl (evidence, version, port-forward) and a credential command get the allow-listed environment:
a sentinel credential in the worker's environment is not in the child's /proc/<pid>/environ (issue #27
item 3). Each child is a shell script that copies its own environ, then behaves like the tool."""

from __future__ import annotations

import asyncio
import uuid

import pytest

from clients.credentials import fetch_secret
from clients.kube import KubectlPortForward, KubeEvidence, kubectl_client_version
from domain.config import CredentialSource

SENTINELS = ("SENTINEL_WORKER_TOKEN", "TEMPORAL_API_KEY", "AWS_SECRET_ACCESS_KEY", "GITHUB_TOKEN")


@pytest.fixture
def sentinel_env(monkeypatch, tmp_path):
    values = {name: f"{name.lower()}-{uuid.uuid4().hex}" for name in SENTINELS}
    for name, value in values.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("KUBECONFIG", str(tmp_path / "kubeconfig"))  # a pointer kubectl needs: passed on
    return values


def _tool(tmp_path, body: str):
    seen = tmp_path / "environ"
    seen.mkdir(exist_ok=True)
    exe = tmp_path / "tool"
    exe.write_text(f'#!/bin/sh\ncat /proc/$$/environ > {seen}/$$.environ\n{body}\n')
    exe.chmod(0o755)
    return str(exe), seen


def _environs(seen) -> list[dict[str, str]]:
    out = []
    for p in sorted(seen.glob("*.environ")):
        out.append(dict(e.split("=", 1) for e in p.read_bytes().decode().split("\0") if "=" in e))
    assert out, "the child never ran"
    return out


def _assert_clean(seen, values, *, kubeconfig: str | None = None):
    for env in _environs(seen):
        assert "PATH" in env
        text = "\0".join(f"{k}={v}" for k, v in env.items())
        assert not [v for v in values.values() if v in text]
        assert not set(SENTINELS) & set(env)
        if kubeconfig:
            assert env.get("KUBECONFIG") == kubeconfig


def test_kubectl_evidence_and_version_get_the_allow_list(tmp_path, sentinel_env):
    exe, seen = _tool(tmp_path, 'case "$*" in *version*) echo \'{"clientVersion": {"gitVersion": "v1.31"}}\';; '
                                '*) echo \'{"items": []}\';; esac')
    assert asyncio.run(kubectl_client_version(exe)) == "v1.31"
    facts = asyncio.run(KubeEvidence(exe, None, None).collect("pod-1"))
    assert facts.pod_name == "pod-1"
    _assert_clean(seen, sentinel_env, kubeconfig=str(tmp_path / "kubeconfig"))


def test_kubectl_port_forward_gets_the_allow_list(tmp_path, sentinel_env):
    exe, seen = _tool(tmp_path, 'echo "Forwarding from 127.0.0.1:1 -> 10000"\nexec sleep 30')

    async def main():
        async with KubectlPortForward(None, None, kubectl=exe) as url:
            assert url.startswith("http://127.0.0.1:")

    asyncio.run(main())
    _assert_clean(seen, sentinel_env, kubeconfig=str(tmp_path / "kubeconfig"))


def test_a_credential_command_gets_the_allow_list(tmp_path, sentinel_env):
    # A random value, as a real credential is: fetch_secret registers it with the process-wide redactor,
    # which also hides pieces of it (a wrapped token), so a value made of words ("credential") would redact
    # those words in every later test of this process (it hid preflight's check names).
    secret = f"fetched-{uuid.uuid4().hex}"
    exe, seen = _tool(tmp_path, f"echo {secret}")
    value = fetch_secret(CredentialSource(kind="command", argv=[exe]), what="t")
    assert value == secret
    _assert_clean(seen, sentinel_env)


def test_every_process_production_code_starts_is_given_an_environment():
    """A static guard: each subprocess/asyncio call in the service's code passes ``env=`` (clients/child_env.py,
    or the rehearsal's environment built from nothing), so a new call cannot inherit the worker's by default.
    GitPython's own spawn point is wrapped in clients/git_source.py (tests/activities/test_child_env.py)."""
    import ast
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    spawners = {"subprocess": {"run", "Popen", "call", "check_call", "check_output"},
                "asyncio": {"create_subprocess_exec", "create_subprocess_shell"}}
    files = [p for d in ("clients", "rehearsal", "activities", "runtime", "domain", "workflows") for p in (root / d).rglob("*.py")]
    files += [root / "worker.py", root / "starter.py"]
    calls, missing = 0, []
    for path in files:
        for node in ast.walk(ast.parse(path.read_text())):
            if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                    and node.func.attr in spawners.get(ast.unparse(node.func.value).split(".")[-1], ())):
                calls += 1
                if not any(k.arg == "env" for k in node.keywords):
                    missing.append(f"{path.relative_to(root)}:{node.lineno}")
    assert calls >= 6 and missing == [], missing
