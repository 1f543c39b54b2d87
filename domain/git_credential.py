"""Where git's credential may go: only to the configured GitHub's own host, only over TLS (loopback excepted).

Why pure and separate: whether a remote gets the service's token at all is decided here, before git
starts, from the configuration alone (``github.web_url``, else ``github.api_url``); the credential
helper (clients/git_credential_helper.py) then answers only for that one origin, so a redirect or a
``url.*.insteadOf`` to another host gets nothing either. ``repos.marinskyrl_url`` on another host, a
``file://`` or ssh remote, or plain http to a non-loopback host: no credential, and git's refusal says why.
"""

from __future__ import annotations

from urllib.parse import urlsplit

from domain.credential_hosts import cleartext_problem
from domain.issue_ref import github_web_host

_DEFAULT_PORTS = {"https": 443, "http": 80}


def origin_of(url: str) -> str | None:
    """``scheme://host[:port]`` of an http(s) URL as git names it to a credential helper (host lower-case,
    a default port dropped, no user info); None for anything else (``file://``, ssh, scp-like ``git@h:p``)."""
    try:
        parts = urlsplit(url.strip())
        port = parts.port
    except ValueError:
        return None
    scheme = parts.scheme.lower()
    if scheme not in _DEFAULT_PORTS or not parts.hostname:
        return None
    host = parts.hostname.lower()
    if ":" in host:
        host = f"[{host}]"
    return f"{scheme}://{host}" + (f":{port}" if port and port != _DEFAULT_PORTS[scheme] else "")


def github_git_origin(api_url: str, web_url: str | None) -> tuple[str | None, str]:
    """The origin git's credential is bound to, and the configuration key it comes from: the GitHub whose
    token it is (``github.web_url``; else ``github.api_url``'s host without ``api.``, over https)."""
    if web_url:
        return origin_of(web_url), "github.web_url"
    api = urlsplit(api_url)
    return origin_of(f"{api.scheme or 'https'}://{github_web_host(api_url)}"), "github.api_url"


def credential_refusal(remote_url: str, origin: str | None, *, bound_by: str) -> str | None:
    """Why the credential bound to ``origin`` must not go to ``remote_url`` (None: it may).

    Both rules at once: the same scheme, host and port as the credential's own GitHub, and TLS unless
    that host is loopback (a local stand-in; ``domain.credential_hosts``, the rule every credential obeys)."""
    remote = origin_of(remote_url)
    if remote is None:
        return "the remote is not an http(s) URL, so git is given no token for it"
    if origin is None:
        return f"{bound_by} is not an http(s) URL, so git's credential is bound to no host"
    if remote != origin:
        return f"git's credential goes only to {origin} ({bound_by}), not to {remote}"
    return cleartext_problem(remote_url, credential=f"git's credential ({bound_by})")
