"""Fetch secrets at execution time from a configured source.

Why: the runbook forbids persisting credentials. A ``CredentialSource`` in the configuration says
*where* a secret lives (env var, file, command such as ``gh auth token``); the value is read only
inside the activity that needs it and is handed straight to the transport (job env, HTTP header).
Errors name the source, never the value.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

from clients.child_env import CREDENTIAL_COMMAND, child_env
from domain.config import CredentialSource
from domain.redact import register_secret


class CredentialError(RuntimeError):
    """A credential could not be obtained; the message names the source only."""


class CredentialToolMissing(CredentialError):
    """The command a credential comes from (e.g. ``gh auth token``) is not installed on this worker."""


def fetch_secret(source: CredentialSource, *, what: str, timeout_s: float = 30.0) -> str:
    """Return the secret named by ``source`` and register it for redaction."""
    if source.kind == "literal_public" and what != "registry.user":
        # A value written in the file is public by definition: never a secret, so never unredacted.
        raise CredentialError(f"{what}: kind 'literal_public' cannot hold a secret (use env, file or command)")
    value = _read(source, what=what, timeout_s=timeout_s)
    if not value:
        raise CredentialError(f"{what}: {source.describe()} yielded an empty value")
    if source.kind != "literal_public":
        register_secret(value)
    return value


def _read(source: CredentialSource, *, what: str, timeout_s: float) -> str:
    match source.kind:
        case "env":
            if not source.name:
                raise CredentialError(f"{what}: env source needs 'name'")
            value = os.environ.get(source.name)
            if value is None:
                raise CredentialError(f"{what}: environment variable {source.name} is not set")
            return value.strip()
        case "file":
            if not source.path:
                raise CredentialError(f"{what}: file source needs 'path'")
            try:
                return Path(source.path).expanduser().read_text().strip()
            except OSError as e:
                raise CredentialError(f"{what}: cannot read {source.path}: {e.strerror}") from None
        case "command":
            if not source.argv:
                raise CredentialError(f"{what}: command source needs 'argv'")
            try:
                # The allow-listed environment: a credential command is not handed the other credentials.
                out = subprocess.run(source.argv, capture_output=True, text=True, timeout=timeout_s, check=False,
                                     stdin=subprocess.DEVNULL, env=child_env(allow=CREDENTIAL_COMMAND))
            except FileNotFoundError:
                raise CredentialToolMissing(f"{what}: {source.describe()} failed: `{source.argv[0]}` is not installed on "
                                      "this worker (not on PATH)") from None
            except (OSError, subprocess.TimeoutExpired) as e:
                raise CredentialError(f"{what}: {source.describe()} failed: {type(e).__name__}") from None
            if out.returncode != 0:
                # stderr of e.g. `gh auth token` never carries the token; still keep it short.
                raise CredentialError(
                    f"{what}: {source.describe()} exited {out.returncode}: {out.stderr.strip()[:200]}"
                )
            return out.stdout.strip()
        case "literal_public":
            return source.value or ""
    raise CredentialError(f"{what}: unknown credential source kind {source.kind!r}")
