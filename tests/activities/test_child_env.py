"""Subprocesses get an allow-listed environment: the lint command (repository code) and every git
process read /proc/<pid>/environ and find none of the service's credentials (issue #21 item 4)."""

from __future__ import annotations

import os
import shutil
import stat
import uuid

from activities.record import RecordActivities
from clients.child_env import child_env
from domain.redact import register_secret
from tests.activities.test_record_guard import _inp
from tests.fixtures_git import fresh_remotes


def _environs(directory) -> list[dict[str, str]]:
    out = []
    for p in sorted(directory.glob("*.environ")):
        pairs = [e.split("=", 1) for e in p.read_bytes().decode(errors="replace").split("\0") if "=" in e]
        out.append(dict(pairs))
    return out


def test_lint_and_git_subprocesses_hold_no_credential(tmp_path, monkeypatch):
    from domain.config import ServiceConfig

    remotes = fresh_remotes(tmp_path / "remotes")
    gh_token, reg_token, cloud = (f"{what}-{uuid.uuid4().hex}" for what in ("ghtok", "regtok", "cloud"))
    monkeypatch.setenv("SENTINEL_GITHUB_TOKEN", gh_token)
    monkeypatch.setenv("SENTINEL_REGISTRY_TOKEN", reg_token)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", cloud)  # the evidence store's, say: no child needs it
    seen = tmp_path / "environ"
    seen.mkdir()
    # Every git process the service starts copies its own /proc/<pid>/environ, then becomes the real git.
    bindir = tmp_path / "bin"
    bindir.mkdir()
    wrapper = bindir / "git"
    wrapper.write_text(f'#!/bin/sh\ncat /proc/$$/environ > {seen}/git-$$.environ\nexec {shutil.which("git")} "$@"\n')
    wrapper.chmod(wrapper.stat().st_mode | stat.S_IEXEC)
    monkeypatch.setenv("PATH", f"{bindir}:{os.environ['PATH']}")
    lint = ["sh", "-c", f"cat /proc/$$/environ > {seen}/lint-$$.environ"]
    config = ServiceConfig.model_validate({
        "work_dir": str(tmp_path / "work"),
        "repos": {"marinskyrl_url": remotes.marinskyrl_url, "harbor_url": remotes.harbor_url},
        "clusters": {},
        "registry": {"image_repository": "127.0.0.1:5000/x", "user": {"kind": "literal_public", "value": "u"},
                     "token": {"kind": "env", "name": "SENTINEL_REGISTRY_TOKEN"}},
        "github": {"token": {"kind": "env", "name": "SENTINEL_GITHUB_TOKEN"}, "lint_command": lint},
    })
    acts = RecordActivities(config)
    acts.learn_secrets()  # the worker has read both credentials, as in a real run
    acts._commit_pins(_inp(remotes), config.github)

    environs = _environs(seen)
    gits = [p for p in seen.glob("git-*.environ")]
    assert len(gits) >= 3 and len(list(seen.glob("lint-*.environ"))) == 1
    for env in environs:
        assert "PATH" in env  # the allow-list still lets the tools run
        text = "\n".join(f"{k}={v}" for k, v in env.items())
        for value in (gh_token, reg_token, cloud):
            assert value not in text
        assert not {"SENTINEL_GITHUB_TOKEN", "SENTINEL_REGISTRY_TOKEN", "AWS_SECRET_ACCESS_KEY"} & set(env)


def test_child_env_drops_registered_secrets_even_under_allowed_names():
    register_secret("allowed-name-but-secret-value-42")
    env = child_env(base={"PATH": "/bin", "HOME": "allowed-name-but-secret-value-42", "GITHUB_TOKEN": "x"},
                    extra={"NEEDED": "passed explicitly"})
    assert env == {"PATH": "/bin", "NEEDED": "passed explicitly"}
