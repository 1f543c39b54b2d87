"""Every credential goes over TLS (loopback excepted) to its own configured host (issue #27 item 2).

The rule is pure (domain/credential_hosts.py); the configuration applies it at load to every address a
credential is sent to and names the key, so the worker and the starter refuse the file before anything."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest

from domain.config import ConfigError, ServiceConfig, load_config
from domain.credential_hosts import cleartext_problem, destination_problem, is_loopback_host, scheme_and_host

BASE = {
    "work_dir": "/tmp/unused",
    "repos": {"marinskyrl_url": "https://github.com/acme/MarinSkyRL.git",
              "harbor_url": "https://github.com/acme/harbor.git"},
    "clusters": {"cw": {"controller_url": "https://iris.example.org"}},
    "registry": {"image_repository": "ghcr.io/acme/images", "user": {"kind": "literal_public", "value": "u"},
                 "token": {"kind": "env", "name": "REG"}},
    "github": {"api_url": "https://api.github.com", "token": {"kind": "env", "name": "GH"}},
}


def _with(path: str, value) -> dict:
    data = copy.deepcopy(BASE)
    *parents, last = path.split(".")
    node = data
    for p in parents:
        node = node.setdefault(p, {})
    node[last] = value
    return data


def _toml(value) -> str:
    if isinstance(value, dict):
        return "{" + ", ".join(f"{k} = {_toml(v)}" for k, v in value.items()) + "}"
    if isinstance(value, list):
        return "[" + ", ".join(_toml(v) for v in value) + "]"
    return f'"{value}"'


def _write(tmp: Path, data: dict) -> Path:
    lines = [f'work_dir = "{data["work_dir"]}"']
    for section in ("repos", "registry", "github", "evidence"):
        if section in data:
            lines.append(f"[{section}]")
            lines += [f"{k} = {_toml(v)}" for k, v in data[section].items()]
    for name, cluster in data["clusters"].items():
        lines.append(f"[clusters.{name}]")
        lines += [f"{k} = {_toml(v)}" for k, v in cluster.items()]
    path = tmp / "config.toml"
    path.write_text("\n".join(lines) + "\n")
    return path


# (what changes, the key the refusal must name, the credential it must name)
CLEARTEXT = [
    ("github.api_url", "http://github.internal/api/v3", "github.api_url", "github.token"),
    ("github", {"api_url": "http://github.internal/api/v3",
                "app": {"app_id": "1", "installation_id": 2, "private_key": {"kind": "file", "path": "/k.pem"}}},
     "github.api_url", "github.app.private_key"),
    ("registry", {**BASE["registry"], "user": {"kind": "token_owner"},
                  "github_api_url": "http://github.internal/api/v3"}, "registry.github_api_url", "registry.token"),
    ("registry", {**BASE["registry"], "image_repository": "registry.internal:5000/acme",
                  "insecure_hosts": ["registry.internal:5000"]}, "registry.insecure_hosts", "registry.token"),
    ("clusters", {"cw": {"controller_url": "http://10.0.0.7:10000", "token": {"kind": "env", "name": "IRIS"}}},
     "clusters.cw.controller_url", "clusters.cw.token"),
    ("clusters", {"cw": {"controller_url": "http://iris.internal:10000"}}, "clusters.cw.controller_url",
     "the job's secrets"),
    ("repos.marinskyrl_url", "http://git.internal/acme/MarinSkyRL.git", "repos.marinskyrl_url", "git push"),
    ("evidence", {"url": "s3://bucket/evidence", "storage_options": {"endpoint_url": "http://minio.internal:9000"}},
     "evidence.storage_options.endpoint_url", "evidence store"),
    ("evidence", {"url": "http://store.internal/evidence"}, "evidence.url", "evidence store"),
]


@pytest.mark.parametrize("path, value, key, credential", CLEARTEXT, ids=[c[2] + "-" + c[3][:14] for c in CLEARTEXT])
def test_a_credential_over_plain_http_to_a_remote_host_is_refused_at_load_naming_the_key(tmp_path, path, value,
                                                                                        key, credential):
    with pytest.raises(ConfigError) as err:
        load_config(_write(tmp_path, _with(path, value)))
    message = str(err.value)
    assert str(tmp_path / "config.toml") in message and f"{key} = " in message, message
    assert credential in message and "cleartext" in message and "https://" in message, message


def _swap(value, change):
    if isinstance(value, dict):
        return {k: _swap(v, change) for k, v in value.items()}
    if isinstance(value, list):
        return [_swap(v, change) for v in value]
    return change(value) if isinstance(value, str) else value


def _to_loopback(text: str) -> str:
    for host in ("github.internal", "registry.internal", "10.0.0.7", "iris.internal", "git.internal",
                 "minio.internal", "store.internal"):
        text = text.replace(host, "127.0.0.1")
    return text


@pytest.mark.parametrize("path, value, key, credential", CLEARTEXT, ids=[c[2] + "-" + c[3][:14] for c in CLEARTEXT])
def test_the_same_address_on_loopback_or_over_https_loads(path, value, key, credential):
    ServiceConfig.model_validate(_with(path, _swap(value, _to_loopback)))  # the sandbox and the tests
    if key != "registry.insecure_hosts":  # an insecure registry is http by definition
        ServiceConfig.model_validate(_with(path, _swap(value, lambda t: t.replace("http://", "https://"))))


def test_the_rule_itself():
    assert is_loopback_host("127.0.0.5") and is_loopback_host("[::1]") and is_loopback_host("localhost")
    assert not is_loopback_host("127.example.org") and not is_loopback_host("10.0.0.1")
    assert scheme_and_host("git@github.com:acme/x.git") == ("ssh", "github.com")
    assert scheme_and_host("/srv/git/x.git") == ("file", "")
    assert scheme_and_host("HTTPS://API.GitHub.com/x") == ("https", "api.github.com")
    assert cleartext_problem("http://127.0.0.1:8080/x", credential="t") is None
    assert cleartext_problem("ssh://git@github.com/x", credential="t") is None
    assert "cleartext" in cleartext_problem("http://[2001:db8::1]:80/", credential="t")
    assert destination_problem("https://api.github.com/user", ["api.github.com"], credential="github.token") is None
    refused = destination_problem("https://evil.example/user", ["api.github.com"], credential="github.token")
    assert "github.token goes only to api.github.com" in refused and "evil.example" in refused
    # a look-alike host is another host: names are compared whole, never by suffix
    assert destination_problem("https://api.github.com.evil.example/", ["api.github.com"], credential="t")


def test_credential_hosts_name_each_credentials_own_destinations():
    config = ServiceConfig.model_validate(_with("registry", {**BASE["registry"], "token_realm_hosts": ["auth.docker.io"],
                                                             "image_repository": "registry-1.docker.io/acme/x"}))
    assert config.credential_hosts("github.token") == ("api.github.com", "github.com")
    assert config.credential_hosts("registry.token") == ("registry-1.docker.io", "auth.docker.io")
    assert config.credential_hosts("clusters.cw.token") == ("iris.example.org",)
    ghe = ServiceConfig.model_validate(_with("github.api_url", "https://ghe.example:8443/api/v3"))
    assert ghe.credential_hosts("github.token") == ("ghe.example",)
