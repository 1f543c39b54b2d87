"""git fetches and pushes with the service's own credential, on a worker as deploy/ ships it (issue #27 item 4).

The worker's HOME is an empty directory and no credential helper is configured for it; the remotes are
served over smart HTTP by real ``git http-backend`` (sandbox/git_http.py) that, as GitHub does, answers
an anonymous push (and any read of a private repository) with 401. The service hands github.token, or an
installation token minted for github.app by the GitHub stand-in, to each git command through its own
credential helper. Sentinels prove the token is in no file (``.git/config``, HOME), no argv or environment
of any git process, no log line, result or error; a wrong token fails at once as AuthenticationFailed
naming the configuration key; a remote on another host never sees the token.
"""

from __future__ import annotations

import asyncio
import base64
import logging
import os
import shutil
import stat
import subprocess
import sys
import uuid
from pathlib import Path

import httpx
import pytest
from temporalio.exceptions import ApplicationError
from temporalio.testing import ActivityEnvironment

from activities import errors
from activities.preflight import PreflightActivities
from activities.source import SourceActivities
from clients import git_credential_helper, git_source
from domain.config import ServiceConfig
from domain.git_credential import credential_refusal, github_git_origin, origin_of
from domain.models import PreflightInput, PrepareSourceInput
from domain.redact import encoded_forms
from sandbox.git_http import GitHttpRemote
from sandbox.github_standin import start_github_standin
from sandbox.stack import MARINSKYRL_SLUG
from tests.fixtures_git import fresh_remotes
from tests.github.test_identities import ALL, rsa_key_pair

USER = git_credential_helper.USERNAME


# ---------------------------------------------------------------- the rule (pure)
def test_the_credential_goes_only_to_its_own_github_over_tls_loopback_excepted():
    assert github_git_origin("https://api.github.com", None) == ("https://github.com", "github.api_url")
    assert github_git_origin("https://ghe.example/api/v3", None) == ("https://ghe.example", "github.api_url")
    assert github_git_origin("https://api.github.com", "https://GitHub.com/") == ("https://github.com",
                                                                                "github.web_url")
    origin = "https://github.com"
    ok = "https://github.com/marin-community/MarinSkyRL.git"
    assert credential_refusal(ok, origin, bound_by="github.web_url") is None
    assert credential_refusal("https://github.com:443/x.git", origin, bound_by="k") is None
    for other in ("https://gitlab.com/marin-community/MarinSkyRL.git", "https://github.com.evil.example/x.git",
                  "https://github.com:8443/x.git", "http://github.com/x.git"):
        assert "goes only to https://github.com (k)" in credential_refusal(other, origin, bound_by="k"), other
    for not_http in ("file:///srv/x.git", "git@github.com:marin-community/MarinSkyRL.git", "ssh://github.com/x"):
        assert "not an http(s) URL" in credential_refusal(not_http, origin, bound_by="k")
    # plain http: only to a loopback host (a local stand-in), never to a host on the network
    assert "git's credential (k) would go in cleartext (http://) to ghe.internal" in \
        credential_refusal("http://ghe.internal/x.git", "http://ghe.internal", bound_by="k")
    assert credential_refusal("http://127.0.0.1:8080/x.git", "http://127.0.0.1:8080", bound_by="k") is None
    assert origin_of("http://127.0.0.1:8080/x.git") == "http://127.0.0.1:8080"


def test_the_helper_answers_only_get_for_its_origin(tmp_path):
    """The helper file as git runs it: a memfd of the token, ``get`` for the right host only."""
    token = "ghp_" + uuid.uuid4().hex
    fd = os.memfd_create("t")
    os.write(fd, token.encode())
    helper = Path(git_credential_helper.__file__)

    def ask(op: str, request: str) -> str:
        return subprocess.run([sys.executable, "-I", "-S", "-B", str(helper), "--fd", str(fd), "--origin",
                               "https://github.com", op], input=request, capture_output=True, text=True,
                              pass_fds=(fd,), check=True, timeout=30).stdout
    try:
        assert ask("get", "protocol=https\nhost=github.com\n\n") == f"username={USER}\npassword={token}\n"
        assert ask("get", "protocol=https\nhost=gitlab.com\n\n") == ""
        assert ask("get", "protocol=http\nhost=github.com\n\n") == ""
        assert ask("store", f"protocol=https\nhost=github.com\nusername={USER}\npassword={token}\n\n") == ""
        assert ask("erase", "protocol=https\nhost=github.com\n\n") == ""
    finally:
        os.close(fd)


# ---------------------------------------------------------------- a worker as deploy/ ships it
@pytest.fixture
def deployed_worker(tmp_path, monkeypatch):
    """HOME an empty directory (the pod's emptyDir), no global git configuration or credential helper,
    and every git process's argv and environment recorded by a shim in front of the real git."""
    home = tmp_path / "home"
    home.mkdir()
    monkeypatch.setenv("HOME", str(home))
    for var in ("XDG_CONFIG_HOME", "GIT_CONFIG_GLOBAL", "GIT_ASKPASS", "SSH_ASKPASS", "GIT_CONFIG_COUNT"):
        monkeypatch.delenv(var, raising=False)
    seen = tmp_path / "git-processes"
    seen.mkdir()
    bindir = tmp_path / "bin"
    bindir.mkdir()
    shim = bindir / "git"
    shim.write_text("#!/bin/sh\n"
                    f"cat /proc/$$/cmdline > {seen}/$$.argv\n"
                    f"cat /proc/$$/environ > {seen}/$$.environ\n"
                    f'exec {shutil.which("git")} "$@"\n')
    shim.chmod(shim.stat().st_mode | stat.S_IEXEC)
    monkeypatch.setenv("PATH", f"{bindir}:{os.environ['PATH']}")
    return home, seen


def _config(tmp_path: Path, *, marinskyrl_url: str, harbor_url: str, github: dict) -> ServiceConfig:
    """deploy/k8s/base/configmap.yaml's shape: the token in a mounted file, only paths in the config."""
    return ServiceConfig.model_validate({
        "work_dir": str(tmp_path / "work"),
        "repos": {"marinskyrl_url": marinskyrl_url, "harbor_url": harbor_url, "marinskyrl_slug": MARINSKYRL_SLUG},
        "clusters": {},
        "registry": {"image_repository": "127.0.0.1:5000/gpu-rl", "user": {"kind": "literal_public", "value": "u"},
                     "token": {"kind": "env", "name": "UNUSED_REGISTRY_TOKEN"}},
        "github": github,
    })


def _secret_file(tmp_path: Path, name: str, value: str) -> dict:
    path = tmp_path / "secrets" / name
    path.parent.mkdir(exist_ok=True)
    path.write_text(value + "\n")
    path.chmod(0o400)
    return {"kind": "file", "path": str(path)}


def _prepare(remotes, request_id: str = "deploy-1") -> PrepareSourceInput:
    return PrepareSourceInput(request_id=request_id, base_commit=remotes.marinskyrl_head,
                              harbor_commit=remotes.harbor_head, push=True)


def _branch_head(bare: Path, branch: str) -> str | None:
    out = subprocess.run(["git", "--git-dir", str(bare), "rev-parse", "--verify", "--quiet",
                          f"refs/heads/{branch}"], capture_output=True, text=True)
    return out.stdout.strip() or None


def _files_holding(roots: list[Path], secret: str) -> list[str]:
    """Every file under ``roots`` holding ``secret`` in any encoding redaction knows (raw, URL, base64)."""
    forms = [f.encode() for f in encoded_forms(secret)]
    hits = []
    for root in roots:
        for path in root.rglob("*"):
            if path.is_file() and not path.is_symlink():
                data = path.read_bytes()
                if any(f in data for f in forms):
                    hits.append(str(path))
    return hits


def _assert_nowhere(secret: str, *, roots: list[Path], seen: Path, texts: list[str]) -> None:
    assert _files_holding(roots, secret) == []  # no .git/config, mirror, worktree, HOME file, bundle
    records = list(seen.glob("*.argv")) + list(seen.glob("*.environ"))
    assert records and _files_holding([seen], secret) == []  # no git process's argv or environment
    for text in texts:
        assert not any(f in text for f in encoded_forms(secret))


async def _run_bounded(fn, *args, timeout_s: float = 240):
    """A git waiting on a username prompt would hang here: bounded (generously: the machine may be loaded),
    so it fails instead."""
    return await asyncio.wait_for(ActivityEnvironment().run(fn, *args), timeout_s)


@pytest.mark.parametrize("home_config", ["empty", "store-helper"])
async def test_fetch_and_push_of_a_private_repository_with_github_token(tmp_path, deployed_worker, caplog,
                                                                        home_config):
    """``store-helper``: an operator's ``credential.helper = store`` in HOME (which would write every
    credential git uses to ~/.git-credentials) is never asked and never told to store the service's."""
    home, seen = deployed_worker
    if home_config == "store-helper":
        (home / ".gitconfig").write_text("[credential]\n\thelper = store\n")
    token = "ghp_" + uuid.uuid4().hex + "sentinel"
    remotes = fresh_remotes(tmp_path / "remotes")
    served = GitHttpRemote(Path(remotes.root), users={USER: token}, writers={USER}).start()  # private: 401 to all
    try:
        git_host = served.url("").rstrip("/")
        config = _config(tmp_path, marinskyrl_url=served.url("marinskyrl.git"), harbor_url=served.url("harbor.git"),
                         github={"api_url": "https://api.github.com", "web_url": git_host,
                                 "token": _secret_file(tmp_path, "github-token", token)})
        acts = SourceActivities(config)
        caplog.set_level(logging.DEBUG)
        snap = await _run_bounded(acts.publish_source, _prepare(remotes))
    finally:
        served.stop()
    assert snap.pushed and _branch_head(Path(remotes.root) / "marinskyrl.git", snap.branch) == snap.build_commit
    # the token was presented by git (through the helper), and only as Basic x-access-token:<token>
    basic = "Basic " + base64.b64encode(f"{USER}:{token}".encode()).decode()
    assert basic in served.authorizations and set(served.authorizations) == {basic}
    # nothing written to HOME (no ~/.git-credentials)
    assert sorted(p.name for p in home.iterdir()) == ([] if home_config == "empty" else [".gitconfig"])
    _assert_nowhere(token, roots=[tmp_path / "work", home, Path(remotes.root)], seen=seen,
                    texts=[caplog.text, snap.model_dump_json()])


async def test_a_wrong_token_is_authentication_failed_naming_github_token_not_a_prompt(tmp_path, deployed_worker,
                                                                                      caplog):
    """A public repository (fetches need no credential), so it is the push that is refused."""
    home, seen = deployed_worker
    right, wrong = "ghp_" + uuid.uuid4().hex, "ghp_wrong" + uuid.uuid4().hex
    remotes = fresh_remotes(tmp_path / "remotes")
    served = GitHttpRemote(Path(remotes.root), users={USER: right}, writers={USER}, anonymous_read=True).start()
    try:
        config = _config(tmp_path, marinskyrl_url=served.url("marinskyrl.git"), harbor_url=served.url("harbor.git"),
                         github={"web_url": served.url("").rstrip("/"),
                                 "token": _secret_file(tmp_path, "github-token", wrong)})
        caplog.set_level(logging.DEBUG)
        with pytest.raises(ApplicationError) as info:
            await _run_bounded(SourceActivities(config).publish_source, _prepare(remotes))
    finally:
        served.stop()
    err = info.value
    assert err.type == "AuthenticationFailed" and err.non_retryable, err.message
    # refused because git presented the wrong token (through the helper), not because it had none
    assert "Basic " + base64.b64encode(f"{USER}:{wrong}".encode()).decode() in served.authorizations
    assert "config:github.token (file:" in err.message and "replace it" in err.message
    assert "/marinskyrl.git" in err.message
    assert _branch_head(Path(remotes.root) / "marinskyrl.git", "gpu-rl-build/deploy-1") is None
    _assert_nowhere(wrong, roots=[tmp_path / "work", home], seen=seen, texts=[caplog.text, err.message])


async def test_a_remote_on_another_host_gets_no_credential(tmp_path, deployed_worker):
    """The configured GitHub is one server; repos.marinskyrl_url points at another that WOULD accept the
    token: the service never sends it there, so the push is refused (401) and says where the token goes."""
    home, seen = deployed_worker
    token = "ghp_" + uuid.uuid4().hex
    remotes = fresh_remotes(tmp_path / "remotes")
    github_host = GitHttpRemote(Path(remotes.root), users={USER: token}, writers={USER}).start()
    elsewhere = GitHttpRemote(Path(remotes.root), users={USER: token}, writers={USER}, anonymous_read=True).start()
    try:
        config = _config(tmp_path, marinskyrl_url=elsewhere.url("marinskyrl.git"),
                         harbor_url=elsewhere.url("harbor.git"),
                         github={"web_url": github_host.url("").rstrip("/"),
                                 "token": _secret_file(tmp_path, "github-token", token)})
        with pytest.raises(ApplicationError) as info:
            await _run_bounded(SourceActivities(config).publish_source, _prepare(remotes))
    finally:
        github_host.stop()
        elsewhere.stop()
    err = info.value
    assert err.type == "AuthenticationFailed", err.message
    assert f"goes only to {github_host.url('').rstrip('/')} (github.web_url)" in err.message
    assert "config:github.token" in err.message
    assert not any(f in a for a in elsewhere.authorizations for f in encoded_forms(token))
    assert github_host.authorizations == []
    _assert_nowhere(token, roots=[tmp_path / "work", home], seen=seen, texts=[err.message])


async def test_push_with_a_github_app_installation_token(tmp_path, deployed_worker, caplog):
    """github.app: the worker mints an installation token from the GitHub stand-in and git pushes with it;
    the git host accepts exactly the tokens the stand-in issued (asked back with the token itself)."""
    home, seen = deployed_worker
    remotes = fresh_remotes(tmp_path / "remotes")
    gh = start_github_standin(tmp_path / "gh", {MARINSKYRL_SLUG: str(Path(remotes.root) / "marinskyrl.git")})
    private, public = rsa_key_pair()
    gh.register_app("7331", public, 4242, permissions=ALL)
    presented: list[str] = []

    def installation_token(user: str, token: str) -> str | None:
        presented.append(token)
        ok = user == USER and httpx.get(f"{gh.api_url}/repos/{MARINSKYRL_SLUG}", timeout=30,
                                        headers={"Authorization": f"Bearer {token}"}).status_code == 200
        return "app" if ok else None

    served = GitHttpRemote(Path(remotes.root), users={}, writers={"app"}, verify=installation_token).start()
    try:
        config = _config(tmp_path, marinskyrl_url=served.url("marinskyrl.git"), harbor_url=served.url("harbor.git"),
                         github={"api_url": gh.api_url, "web_url": served.url("").rstrip("/"),
                                 "app": {"app_id": "7331", "installation_id": 4242,
                                         "private_key": _secret_file(tmp_path, "github-app.pem", private)}})
        caplog.set_level(logging.DEBUG)
        snap = await _run_bounded(SourceActivities(config).publish_source, _prepare(remotes, "deploy-app"))
        minted = gh.installation_tokens_minted()
    finally:
        served.stop()
        gh.stop()
    assert snap.pushed and _branch_head(Path(remotes.root) / "marinskyrl.git", snap.branch) == snap.build_commit
    assert minted == 1 and presented and all(t.startswith("ghs_") for t in presented)
    key_lines = [ln for ln in private.splitlines() if not ln.startswith("-----")]
    for secret in {*presented, key_lines[3]}:
        _assert_nowhere(secret, roots=[tmp_path / "work", home], seen=seen,
                        texts=[caplog.text, snap.model_dump_json()])


def test_preflight_proves_git_push_with_the_configured_token_and_names_the_key_of_a_wrong_one(tmp_path,
                                                                                              deployed_worker):
    """Preflight's ``git push --dry-run`` uses the same credential: accepted with the right token; a wrong
    one is named as github.token (not as repos.marinskyrl_url), before anything is pushed."""
    home, seen = deployed_worker
    right, wrong = "ghp_" + uuid.uuid4().hex, "ghp_wrong" + uuid.uuid4().hex
    remotes = fresh_remotes(tmp_path / "remotes")
    served = GitHttpRemote(Path(remotes.root), users={USER: right}, writers={USER}, anonymous_read=True).start()
    head = remotes.marinskyrl_head
    inp = PreflightInput(request_id="pf", base_commit=head, build_commit=head, targets=[])
    try:
        checks = {}
        for token in (right, wrong):
            config = _config(tmp_path, marinskyrl_url=served.url("marinskyrl.git"),
                             harbor_url=served.url("harbor.git"),
                             github={"web_url": served.url("").rstrip("/"),
                                     "token": _secret_file(tmp_path, f"github-token-{token[:9]}", token)})
            checks[token] = PreflightActivities(config)._git_push(inp)
    finally:
        served.stop()
    assert checks[right].ok, checks[right]
    bad = checks[wrong]
    assert not bad.ok and bad.config_key == "github.token" and "refused the credential" in bad.detail
    assert wrong not in bad.detail and right not in checks[right].detail
    assert _branch_head(Path(remotes.root) / "marinskyrl.git", "gpu-rl-build/preflight-pf") is None  # dry run


def test_a_refused_git_credential_maps_to_its_key_and_next_step():
    cred = git_source.GitCredential(config_key="github.app", source="an installation token of app 1, installation 2",
                                    origin="https://github.com", bound_by="github.web_url",
                                    fix="install the App on this repository", token=lambda: "x")
    e = git_source.RemoteAuthFailed("git remote https://github.com/a/b.git refused the credential: ...; git "
                                    f"authenticated ... with {cred.describe()}", "https://github.com/a/b.git",
                                    credential_note=f"with {cred.describe()}")
    mapped = errors.classify_exception(e)
    assert mapped.type == "AuthenticationFailed" and "config:github.app" in mapped.message
    assert "replace the git credential of that remote" not in mapped.message
