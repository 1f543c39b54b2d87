"""Where the build evidence is posted: `--issue-url` parsed once, refused at input time when unclear.

Why: an issue in another repository (marin#7920 for a MarinSkyRL build) must be commented on in THAT
repository; a value that names no issue must be refused before anything starts, not silently skipped
when the build is already done.
"""

from __future__ import annotations

import re
from urllib.parse import urlsplit

from pydantic import BaseModel

_URL = re.compile(r"^https?://(?P<host>[^/\s]+)/(?P<repo>[A-Za-z0-9_.-]+/[A-Za-z0-9_.-]+)/(?:issues|pull)/(?P<n>\d+)/?"
                  r"(?:[?#].*)?$")
_SHORT = re.compile(r"^(?P<repo>[A-Za-z0-9_.-]+/[A-Za-z0-9_.-]+)?#(?P<n>\d+)$")
_NUMBER = re.compile(r"^(?P<n>\d+)$")


class IssueRef(BaseModel):
    """An issue (or PR) number; ``repo`` is ``owner/name``, or None for the build's own repository."""

    repo: str | None = None
    number: int

    def in_repo(self, default_repo: str) -> tuple[str, int]:
        return self.repo or default_repo, self.number

    def __str__(self) -> str:
        return f"{self.repo or ''}#{self.number}"


def parse_issue_ref(value: str) -> IssueRef:
    """``https://github.com/OWNER/REPO/issues/N`` (or ``/pull/N``), ``OWNER/REPO#N``, ``#N`` or ``N``."""
    text = value.strip()
    for pattern in (_URL, _SHORT, _NUMBER):
        m = pattern.match(text)
        if m and int(m["n"]) > 0:
            return IssueRef(repo=m.groupdict().get("repo"), number=int(m["n"]))
    raise ValueError(f"--issue-url: expected https://github.com/OWNER/REPO/issues/N, OWNER/REPO#N or #N; "
                     f"got {text[:80]!r}")


def github_web_host(api_url: str) -> str:
    """The web host of a GitHub API URL: ``https://api.github.com`` → ``github.com``; a GitHub Enterprise
    ``https://ghe.example/api/v3`` (or a stand-in) → its own host."""
    host = urlsplit(api_url).netloc.lower()
    return host.removeprefix("api.") if host.startswith("api.") else host


def check_issue_host(value: str | None, api_url: str, web_url: str | None = None) -> None:
    """Refuse an issue URL on another host than the configured GitHub (a gitlab URL would otherwise be
    commented on GitHub, in a repository of the same name)."""
    if not value:
        return
    parse_issue_ref(value)  # names no issue: refused with its own message
    m = _URL.match(value.strip())
    host = m["host"].lower() if m else None  # OWNER/REPO#N and #N are on the configured GitHub
    expected = urlsplit(web_url).netloc.lower() if web_url else github_web_host(api_url)
    if host and host != expected:
        where = "github.web_url" if web_url else "github.api_url"
        raise ValueError(f"--issue-url {value.strip()[:120]}: host {host} is not the configured GitHub "
                         f"({expected}, from {where}); nothing was started")
