"""git's credential helper for the service's own token (``credential.helper``, set per git command).

Run by git as ``python -I -S -B <this file> --fd N --origin ORIGIN get``: answers ``get`` with
``username=x-access-token`` and the token read from file descriptor N (an anonymous memfd the worker
created for that one git command and handed to it alone), only when git asks for exactly ORIGIN
(``protocol://host[:port]``). ``store`` and ``erase`` do nothing: no token is ever written anywhere.

Why a file run by path, standard library only: it starts in a few milliseconds without the service's
packages on ``sys.path`` (the worker's root filesystem is read-only; ``-B`` writes no bytecode), and its
argv (visible to every user in /proc) carries a descriptor number and a host, never the token.
"""

from __future__ import annotations

import os
import sys

# What GitHub expects as the user of a token over git's Basic auth: required for App installation tokens,
# accepted for personal access tokens (GitHub ignores the name then).
USERNAME = "x-access-token"
MAX_TOKEN_BYTES = 64 * 1024


def parse_request(text: str) -> dict[str, str]:
    """git's credential request (``key=value`` lines up to a blank line) as a dict."""
    out: dict[str, str] = {}
    for line in text.splitlines():
        if not line:
            break
        key, sep, value = line.partition("=")
        if sep:
            out[key] = value
    return out


def answer(request: dict[str, str], origin: str, token: str) -> str:
    """The helper's reply to ``get``: the credential when git asks for ``origin``, else nothing (git then
    has no credential for that host, and fails without prompting)."""
    asked = f"{request.get('protocol', '').lower()}://{request.get('host', '').lower()}"
    if asked != origin.lower() or not token or "\n" in token or "\0" in token:
        return ""
    return f"username={USERNAME}\npassword={token}\n"


def main(argv: list[str]) -> int:
    args = argv[1:]
    try:
        fd = int(args[args.index("--fd") + 1])
        origin = args[args.index("--origin") + 1]
    except (ValueError, IndexError):
        return 0  # misconfigured: no credential rather than a crash in the middle of git
    if not args or args[-1] != "get":
        return 0  # store / erase: nothing is kept, so nothing to do
    request = parse_request(sys.stdin.read())
    try:
        token = os.pread(fd, MAX_TOKEN_BYTES, 0).decode().strip()
    except (OSError, UnicodeDecodeError):
        return 0
    sys.stdout.write(answer(request, origin, token))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
