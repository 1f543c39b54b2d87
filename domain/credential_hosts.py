"""Where a credential may go: over TLS (loopback excepted) and only to the host configured for it.

Why one pure rule: the configuration check at start (``ServiceConfig``), the HTTP client layer at request
time (clients/http_guard.py) and a git push's credential helper ask the same two questions, so they cannot
disagree. Hosts are compared by name and never resolved (DNS must not decide where a token goes).

The loopback exception exists for the sandbox, the tests and ``kubectl port-forward`` (the controller URL
is ``http://127.0.0.1:<port>``): a loopback hop never leaves the machine.
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Callable, Iterable
from urllib.parse import urlsplit

# ``user@host:path`` (scp-like git remote): ssh, never plain text.
_SCP_LIKE = re.compile(r"^(?:[^@/:]+@)?(?P<host>\[[^\]]+\]|[^/:\[\]]+):(?!//)")


Resolver = Callable[[str], Iterable[str]]  # a host name -> the addresses this machine resolves it to


def is_loopback_host(host: str, resolve: Resolver | None = None) -> bool:
    """``localhost`` or a loopback IP literal; a ``*.localhost`` name only when ``resolve`` (this
    machine's resolver) gives loopback addresses alone: RFC 6761 reserves the names, but a resolver may
    still ask DNS for them, and DNS must not decide where a token goes. Without ``resolve`` (a pure
    check, e.g. the configuration at load) such a name is not loopback."""
    host = host.strip("[]").lower().rstrip(".")
    if host in ("localhost", "localhost.localdomain"):
        return True
    if host.endswith(".localhost"):
        if resolve is None:
            return False
        try:
            addresses = [a.split("%")[0] for a in resolve(host)]
            return bool(addresses) and all(ipaddress.ip_address(a).is_loopback for a in addresses)
        except (OSError, ValueError):
            return False
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def scheme_and_host(url: str) -> tuple[str, str]:
    """(scheme, lower-case host) of a URL or an scp-like git remote (``("ssh", host)``); ``host`` is empty
    for a local path or ``file://`` URL."""
    url = url.strip()
    if "://" not in url:
        m = _SCP_LIKE.match(url)
        return ("ssh", m.group("host").strip("[]").lower()) if m else ("file", "")
    parts = urlsplit(url)
    return parts.scheme.lower(), (parts.hostname or "").lower()


def cleartext_problem(url: str, *, credential: str, resolve: Resolver | None = None) -> str | None:
    """Why ``credential`` must not be sent to ``url``: plain ``http://`` to a host that is not loopback.
    None when TLS (or ssh, or a local path) carries it, or the host is loopback."""
    scheme, host = scheme_and_host(url)
    if scheme == "http" and host and not is_loopback_host(host, resolve):
        return (f"{credential} would go in cleartext (http://) to {host}, which is not loopback; "
                "use an https:// address")
    return None


def destination_problem(url: str, allowed_hosts: Iterable[str], *, credential: str,
                        resolve: Resolver | None = None) -> str | None:
    """Why ``credential`` must not be sent to ``url``: cleartext to a non-loopback host, or a host that is
    not one of ``allowed_hosts`` (the hosts configured for that credential; names compared exactly)."""
    if problem := cleartext_problem(url, credential=credential, resolve=resolve):
        return problem
    _, host = scheme_and_host(url)
    allowed = sorted({h.strip("[]").lower() for h in allowed_hosts if h})
    if host not in allowed:
        return f"{credential} goes only to {', '.join(allowed) or 'no host'}, not to {host or url[:80]!r}"
    return None


def host_of(url: str) -> str:
    """The lower-case host of a URL or scp-like git remote ('' for a local path)."""
    return scheme_and_host(url)[1]
