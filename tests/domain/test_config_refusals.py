"""Configuration refusals of issue #36 item 5: each names its key, before anything runs.

A ``*.localhost`` name is loopback only when this machine resolves it to loopback addresses alone; a secret
is never ``literal_public``; a duration is finite and not negative; an operator login is never empty.
Each of these loaded (or counted as loopback) before.
"""

from __future__ import annotations

import math

import pytest

from domain.config import ConfigError, load_config
from domain.credential_hosts import cleartext_problem, is_loopback_host

BASE = """
work_dir = "/tmp/w"
[repos]
marinskyrl_url = "https://github.com/marin-community/MarinSkyRL.git"
harbor_url = "https://github.com/marin-community/harbor.git"
[clusters.c]
controller_url = "http://127.0.0.1:10000"
[registry]
image_repository = "ghcr.io/marin-community/marinskyrl"
user = {kind = "literal_public", value = "me"}
token = {kind = "env", name = "GHCR_TOKEN"}
"""


def _load(tmp_path, extra: str = "", base: str = BASE):
    path = tmp_path / "config.toml"
    path.write_text(base + extra)
    return load_config(path)


def test_the_base_configuration_loads(tmp_path):
    assert _load(tmp_path).registry.user.value == "me"


def test_a_localhost_subdomain_is_loopback_only_where_it_resolves_to_loopback():
    assert is_loopback_host("localhost") and is_loopback_host("127.0.0.1") and is_loopback_host("[::1]")
    assert not is_loopback_host("evil.localhost")  # no resolver (a pure check): not loopback
    assert is_loopback_host("svc.localhost", lambda h: ["127.0.0.1", "::1"])
    assert not is_loopback_host("svc.localhost", lambda h: ["127.0.0.1", "203.0.113.7"])  # DNS answered
    assert not is_loopback_host("svc.localhost", lambda h: [])

    def unresolvable(host):
        raise OSError("no such host")

    assert not is_loopback_host("svc.localhost", unresolvable)
    assert "not loopback" in cleartext_problem("http://evil.localhost:8080/x", credential="the token")
    assert cleartext_problem("http://svc.localhost:8080/x", credential="t", resolve=lambda h: ["127.0.0.1"]) is None


def test_a_localhost_subdomain_in_the_configuration_is_refused_naming_the_key(tmp_path):
    base = BASE.replace('controller_url = "http://127.0.0.1:10000"', 'controller_url = "http://iris.localhost:10000"')
    with pytest.raises(ConfigError, match=r"clusters\.c\.controller_url = 'http://iris\.localhost:10000'.*not loopback"):
        _load(tmp_path, base=base)


@pytest.mark.parametrize("key, where", [
    ("registry.token", 'token = {kind = "literal_public", value = "s3cret"}'),
    ("clusters.c.token", None),
])
def test_a_secret_written_as_literal_public_is_refused_naming_the_key(tmp_path, key, where):
    if where:
        base = BASE.replace('token = {kind = "env", name = "GHCR_TOKEN"}', where)
        extra = ""
    else:
        base = BASE.replace('controller_url = "http://127.0.0.1:10000"',
                            'controller_url = "http://127.0.0.1:10000"\ntoken = {kind = "literal_public", value = "x"}')
        extra = ""
    with pytest.raises(ConfigError, match=rf"{key}: kind 'literal_public' is for a value that is not secret"):
        _load(tmp_path, extra, base=base)


def test_fetch_secret_refuses_literal_public_for_anything_but_the_registry_user():
    from clients.credentials import CredentialError, fetch_secret
    from domain.config import CredentialSource

    source = CredentialSource(kind="literal_public", value="s3cret-value")
    with pytest.raises(CredentialError, match="github.token: kind 'literal_public' cannot hold a secret"):
        fetch_secret(source, what="github.token")
    assert fetch_secret(source, what="registry.user") == "s3cret-value"


@pytest.mark.parametrize("line, key", [
    ("operator_decision_timeout_s = -1", "policy.operator_decision_timeout_s"),
    ("poll_min_interval_s = inf", "policy.poll_min_interval_s"),
    ("progress_interval_s = nan", "policy.progress_interval_s"),
    ("watch_follow_interval_s = -0.5", "policy.watch_follow_interval_s"),
    ("monitor_safety_interval_s = -inf", "policy.monitor_safety_interval_s"),
])
def test_a_non_finite_or_negative_duration_is_refused_naming_the_key(tmp_path, line, key):
    with pytest.raises(ConfigError, match=rf"{key}: .*(finite|>= 0)"):
        _load(tmp_path, f"[policy]\n{line}\n")


def test_every_duration_key_is_checked():
    """Every ``*_s`` number of the configuration is covered by the rule (none has its own escape)."""
    from domain.config import ServiceConfig

    seen = []

    def walk(model):
        for name, field in model.model_fields.items():
            ann = field.annotation
            for sub in getattr(ann, "__args__", (ann,)):
                if isinstance(sub, type) and hasattr(sub, "model_fields"):
                    walk(sub)
            if name.endswith("_s"):
                seen.append(name)
                with pytest.raises(ValueError, match="finite"):
                    model._durations(math.inf, type("I", (), {"field_name": name})())

    walk(ServiceConfig)
    assert "operator_decision_timeout_s" in seen and "read_timeout_s" in seen


@pytest.mark.parametrize("logins", ['["alice", ""]', '["  "]'])
def test_an_empty_operator_login_is_refused_naming_the_key(tmp_path, logins):
    with pytest.raises(ConfigError, match=r"operators\.logins: .*empty login"):
        _load(tmp_path, f"[operators]\nlogins = {logins}\n")
