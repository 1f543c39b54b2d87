"""git pushes and the credential (issue #36 item 4), against real git and real ``git http-backend``.

- a push larger than git's 1 MiB ``http.postBuffer`` goes chunked; the authenticated stand-in
  (sandbox/git_http.py) takes it: 9 MiB of incompressible data is pushed and lands;
- a credentialed command follows no redirect (``http.followRedirects=false``): a remote answering 302
  to another host gets the failure, the other host no request;
- a push the remote refuses (a pre-receive hook) is reported with git's own message, redacted, and not
  as a branch conflict.
"""

from __future__ import annotations

import os
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import git
import pytest

from clients import git_credential_helper
from clients.git_source import (
    BranchConflict,
    GitCredential,
    GitPushFailed,
    GitSourceError,
    push_branch,
    remote_branch_sha,
)
from domain.redact import register_secret
from sandbox.git_http import GitHttpRemote

USER = git_credential_helper.USERNAME


def _credential(origin: str, token: str) -> GitCredential:
    return GitCredential(config_key="github.token", source="test", origin=origin, bound_by="github.api_url",
                         fix="use another token", token=lambda: token)


def _repo(tmp_path: Path, size: int = 0) -> tuple[git.Repo, str]:
    work = git.Repo.init(tmp_path / "work", initial_branch="main")
    with work.config_writer() as c:
        c.set_value("user", "name", "t")
        c.set_value("user", "email", "t@example.org")
    (tmp_path / "work" / "README").write_text("x\n")
    if size:
        (tmp_path / "work" / "blob.bin").write_bytes(os.urandom(size))  # incompressible: the pack is as big
    work.index.add(["README", *(["blob.bin"] if size else [])])
    return work, work.index.commit("c").hexsha


def test_a_push_of_9_mib_goes_through_the_authenticated_standin(tmp_path):
    root = tmp_path / "remotes"
    root.mkdir()
    git.Repo.init(root / "big.git", bare=True)
    token = "push-token-" + os.urandom(8).hex()
    served = GitHttpRemote(root, users={USER: token}, writers={USER}).start()
    try:
        work, sha = _repo(tmp_path, 9 * 1024 * 1024)
        url = served.url("big.git")
        push_branch(Path(work.working_dir), url, "big", sha, credential=_credential(url.rsplit("/", 1)[0], token))
        assert git.Repo(root / "big.git").commit("refs/heads/big").hexsha == sha
        assert remote_branch_sha(Path(work.working_dir), url, "big",
                                 credential=_credential(url.rsplit("/", 1)[0], token)) == sha
    finally:
        served.stop()


class _Counting(BaseHTTPRequestHandler):
    hits: list[str]
    location: str | None = None

    def do_GET(self) -> None:  # noqa: N802
        self.hits.append(self.path)
        if self.location:
            self.send_response(302)
            self.send_header("Location", self.location + self.path)
        else:
            self.send_response(404)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, *_args) -> None:
        pass


def _server(location: str | None) -> tuple[ThreadingHTTPServer, list[str]]:
    hits: list[str] = []
    handler = type("H", (_Counting,), {"hits": hits, "location": location})
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server, hits


def test_a_credentialed_command_follows_no_redirect(tmp_path):
    elsewhere, reached = _server(None)
    redirecting, asked = _server(f"http://127.0.0.1:{elsewhere.server_address[1]}")
    try:
        work, _ = _repo(tmp_path)
        origin = f"http://127.0.0.1:{redirecting.server_address[1]}"
        with pytest.raises(GitSourceError):
            remote_branch_sha(Path(work.working_dir), f"{origin}/repo.git", "main",
                              credential=_credential(origin, "redirect-token-0123456789"))
        assert asked, "the redirecting remote was asked"
        assert reached == [], f"git followed the redirect: {reached}"
    finally:
        redirecting.shutdown()
        elsewhere.shutdown()


def test_a_refused_push_reports_gits_own_message_redacted_not_a_conflict(tmp_path):
    secret = "hook-s3ntinel-" + os.urandom(8).hex()
    register_secret(secret)
    bare = git.Repo.init(tmp_path / "refusing.git", bare=True)
    hook = Path(bare.git_dir) / "hooks" / "pre-receive"
    hook.write_text(f"#!/bin/sh\necho 'push over the 5 MiB limit of this host (token {secret})' >&2\nexit 1\n")
    hook.chmod(0o755)
    work, sha = _repo(tmp_path)
    with pytest.raises(GitPushFailed) as info:
        push_branch(Path(work.working_dir), str(tmp_path / "refusing.git"), "main", sha)
    message = str(info.value)
    assert not isinstance(info.value, BranchConflict)
    assert "pre-receive hook declined" in message and "over the 5 MiB limit" in message, message
    assert secret not in message and "[REDACTED]" in message
