"""The Temporal connection, the SDK's way: config < named profile < TEMPORAL_* < flags.

TLS cannot be served by the sandbox dev server, so the TLS and API-key options are checked on the
``Client.connect`` arguments; address, namespace and profile are checked against the dev server.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from pathlib import Path

import pytest
from temporalio.service import TLSConfig

from domain.config import ConfigError, TemporalSettings, load_config
from runtime.temporal import ConnectionFlags, connect_kwargs, describe, resolve_config, resolve_settings
from tests.deploy.wheel_venv import minimal_config as _config

ROOT = Path(__file__).resolve().parents[2]
BASE = TemporalSettings(address="from-config:7233", namespace="config-ns", task_queue="q")
SECRET = "sentinel-temporal-api-key-7f3a"


def _profiles(tmp_path: Path) -> Path:
    path = tmp_path / "temporal.toml"
    path.write_text(f"""
[profile.default]
address = "personal-default:7233"

[profile.cloud]
address = "builds.acct.tmprl.cloud:7233"
namespace = "builds.acct"
api_key = "{SECRET}"

[profile.team]
address = "temporal.team.internal:7233"
namespace = "gpu-rl-builds"
[profile.team.tls]
client_cert_path = "{tmp_path / 'client.pem'}"
client_key_path = "{tmp_path / 'client.key'}"
server_ca_cert_path = "{tmp_path / 'ca.pem'}"
server_name = "temporal.team"
""")
    for name in ("client.pem", "client.key", "ca.pem"):
        (tmp_path / name).write_bytes(f"-----PEM {name}-----\n".encode())
    return path


def test_config_alone_and_an_unnamed_personal_profile_is_ignored(tmp_path):
    home = tmp_path / "home"
    (home / ".config/temporalio").mkdir(parents=True)
    (home / ".config/temporalio/temporal.toml").write_text('[profile.default]\naddress = "personal:7233"\n')
    s = resolve_settings(BASE, env={"HOME": str(home)})
    assert (s.address, s.namespace, s.tls, s.api_key) == ("from-config:7233", "config-ns", False, None)
    kwargs = connect_kwargs(s)
    assert kwargs == {"target_host": "from-config:7233", "namespace": "config-ns", "api_key": None, "tls": False}


def test_env_overrides_config_and_the_api_key_is_only_named(monkeypatch):
    env = {"TEMPORAL_ADDRESS": "env:7233", "TEMPORAL_NAMESPACE": "env-ns", "TEMPORAL_API_KEY": SECRET}
    s = resolve_settings(BASE, env=env)
    assert (s.address, s.namespace, s.tls) == ("env:7233", "env-ns", True)
    assert s.api_key.describe() == "env:TEMPORAL_API_KEY"
    assert SECRET not in s.model_dump_json() and SECRET not in describe(s)
    monkeypatch.setenv("TEMPORAL_API_KEY", SECRET)
    kwargs = connect_kwargs(s)
    assert kwargs["api_key"] == SECRET and kwargs["tls"] is True


def test_flags_beat_env_and_profile(tmp_path):
    env = {"TEMPORAL_CONFIG_FILE": str(_profiles(tmp_path)), "TEMPORAL_ADDRESS": "env:7233"}
    s = resolve_settings(BASE, ConnectionFlags(address="flag:7233", namespace="flag-ns", profile="cloud"), env)
    assert (s.address, s.namespace, s.profile) == ("flag:7233", "flag-ns", "cloud")


def test_cloud_profile_api_key_is_read_at_connect_time(tmp_path, monkeypatch):
    path = _profiles(tmp_path)
    s = resolve_settings(BASE, ConnectionFlags(profile="cloud"), {"TEMPORAL_CONFIG_FILE": str(path)})
    assert (s.address, s.namespace, s.tls) == ("builds.acct.tmprl.cloud:7233", "builds.acct", True)
    assert s.api_key.kind == "temporal_profile" and SECRET not in s.model_dump_json()
    monkeypatch.delenv("TEMPORAL_API_KEY", raising=False)
    assert connect_kwargs(s)["api_key"] == SECRET


def test_team_profile_mtls_builds_the_tls_config(tmp_path):
    path = _profiles(tmp_path)
    s = resolve_settings(BASE, env={"TEMPORAL_CONFIG_FILE": str(path), "TEMPORAL_PROFILE": "team"})
    assert s.tls_client_cert_path == str(tmp_path / "client.pem") and s.tls_server_name == "temporal.team"
    tls = connect_kwargs(s)["tls"]
    assert isinstance(tls, TLSConfig)
    assert tls.client_cert == b"-----PEM client.pem-----\n"
    assert tls.client_private_key == b"-----PEM client.key-----\n"
    assert tls.server_root_ca_cert == b"-----PEM ca.pem-----\n" and tls.domain == "temporal.team"
    assert "mTLS" in describe(s) and "client.key" not in describe(s)


def test_tls_env_variables_without_a_profile_file(tmp_path):
    (tmp_path / "c.pem").write_bytes(b"cert")
    (tmp_path / "k.pem").write_bytes(b"key")
    env = {"TEMPORAL_TLS_CLIENT_CERT_PATH": str(tmp_path / "c.pem"),
           "TEMPORAL_TLS_CLIENT_KEY_PATH": str(tmp_path / "k.pem")}
    tls = connect_kwargs(resolve_settings(BASE, env=env))["tls"]
    assert isinstance(tls, TLSConfig) and (tls.client_cert, tls.client_private_key) == (b"cert", b"key")
    assert resolve_settings(BASE, env={"TEMPORAL_TLS": "true"}).tls is True


@pytest.mark.parametrize("flags, env, expected", [
    (ConnectionFlags(profile="nope"), {"TEMPORAL_CONFIG_FILE": "{profiles}"}, r"--profile nope.*'nope' not found"),
    (ConnectionFlags(), {"TEMPORAL_PROFILE": "nope", "TEMPORAL_CONFIG_FILE": "{profiles}"}, r"TEMPORAL_PROFILE=nope"),
    (ConnectionFlags(), {"TEMPORAL_CONFIG_FILE": "/nonexistent/temporal.toml"}, r"TEMPORAL_CONFIG_FILE=/nonexistent"),
    (ConnectionFlags(), {"TEMPORAL_TLS_CLIENT_KEY_DATA": "inline-key"}, r"client key is given inline"),
    (ConnectionFlags(), {"TEMPORAL_TLS_CLIENT_CERT_PATH": "/c.pem"}, r"must be set together"),
])
def test_bad_connection_settings_name_their_source(tmp_path, flags, env, expected):
    profiles = str(_profiles(tmp_path))
    env = {k: v.replace("{profiles}", profiles) for k, v in env.items()}
    with pytest.raises(ConfigError, match=expected):
        resolve_settings(BASE, flags, env)


def test_unreadable_tls_file_names_the_setting():
    s = TemporalSettings(tls_server_ca_cert_path="/nonexistent/ca.pem")
    with pytest.raises(ConfigError, match="tls_server_ca_cert_path: cannot read /nonexistent/ca.pem"):
        connect_kwargs(s)


def test_resolve_config_keeps_the_rest_of_the_config(tmp_path):
    config = load_config(_config(tmp_path, "q-resolve"))
    resolved = resolve_config(config, ConnectionFlags(address="x:1"), env={})
    assert resolved.temporal.address == "x:1" and resolved.temporal.task_queue == "q-resolve"
    assert resolved.repos == config.repos


def _starter(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess:
    base = {k: v for k, v in os.environ.items() if not k.startswith(("TEMPORAL_", "GPU_RL_BUILDER_"))}
    return subprocess.run([sys.executable, str(ROOT / "starter.py"), *args], cwd=ROOT, env={**base, **env},
                          capture_output=True, text=True, timeout=120)


async def test_starter_reaches_the_dev_server_by_flags_and_by_profile(temporal_dev_server, tmp_path):
    config = _config(tmp_path, "q-starter")  # its [temporal] points nowhere
    profiles = tmp_path / "temporal.toml"
    profiles.write_text(f'[profile.sandbox]\naddress = "{temporal_dev_server.address}"\n'
                        f'namespace = "{temporal_dev_server.namespace}"\n')
    by_flags = asyncio.to_thread(_starter, "--config", str(config), "--address", temporal_dev_server.address,
                                 "--namespace", temporal_dev_server.namespace, "status", env={})
    by_profile = asyncio.to_thread(_starter, "--config", str(config), "--profile", "sandbox", "status",
                                   env={"TEMPORAL_CONFIG_FILE": str(profiles)})
    unreachable = asyncio.to_thread(_starter, "--config", str(config), "status", env={})
    for ran in await asyncio.gather(by_flags, by_profile):
        assert ran.returncode == 0, ran.stderr
    ran = await unreachable
    assert ran.returncode == 3 and "127.0.0.1:1" in ran.stderr
    bad = await asyncio.to_thread(_starter, "--config", str(config), "--profile", "missing", "status",
                                  env={"TEMPORAL_CONFIG_FILE": str(profiles)})
    assert bad.returncode == 2 and "--profile missing" in bad.stderr, bad.stderr


def test_worker_with_an_unset_api_key_source_stops_with_exit_2(tmp_path):
    config = _config(tmp_path, "q-key")
    config.write_text(config.read_text().replace(
        'task_queue = "q-key"', 'task_queue = "q-key"\napi_key = {kind = "env", name = "MISSING_TEMPORAL_KEY"}'))
    base = {k: v for k, v in os.environ.items() if not k.startswith(("TEMPORAL_", "GPU_RL_BUILDER_", "MISSING_"))}
    ran = subprocess.run([sys.executable, str(ROOT / "worker.py"), "--config", str(config)], cwd=ROOT, env=base,
                         capture_output=True, text=True, timeout=120)
    assert ran.returncode == 2, ran.stderr
    assert "MISSING_TEMPORAL_KEY is not set" in ran.stderr and "Traceback" not in ran.stderr
