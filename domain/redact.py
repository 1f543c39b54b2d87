"""Process-wide secret redaction.

Every secret fetched at execution time is registered here, and every log line, diagnostics file and
error message that leaves our code passes through ``redact``. It is a second line of defence: the
first is never putting a secret into anything but a job env var or an HTTP header.
"""

from __future__ import annotations

import re
import threading

_lock = threading.Lock()
_secrets: set[str] = set()
REDACTED = "[REDACTED]"
# Shapes of well-known tokens, redacted even if never registered.
_TOKEN_SHAPES = re.compile(r"(ghp_|gho_|ghs_|github_pat_|dckr_pat_)[A-Za-z0-9_]{16,}")
# Header and env shapes that carry credentials.
_AUTH_HEADER = re.compile(r"(?i)(authorization\s*[:=]\s*)(bearer|basic|token)\s+[A-Za-z0-9._~+/=-]+")


# ``NAME=value`` where the name says it holds a credential (a build that prints its environment).
_SECRET_ASSIGNMENT = re.compile(
    r"(?i)\b([A-Z0-9_]*(?:TOKEN|PASSWORD|PASSWD|SECRET|API_KEY|ACCESS_KEY|PRIVATE_KEY|CREDENTIALS?)[A-Z0-9_]*)"
    r"=(?!\[REDACTED\])(\S+)")


def register_secret(value: str) -> None:
    if value and len(value) >= 4:
        with _lock:
            _secrets.add(value)


def redact(text: str) -> str:
    if not text:
        return text
    with _lock:
        secrets = sorted(_secrets, key=len, reverse=True)
    for s in secrets:
        if s in text:
            text = text.replace(s, REDACTED)
    text = _TOKEN_SHAPES.sub(REDACTED, text)
    text = _SECRET_ASSIGNMENT.sub(lambda m: f"{m.group(1)}={REDACTED}", text)
    return _AUTH_HEADER.sub(lambda m: f"{m.group(1)}{m.group(2)} {REDACTED}", text)


def redact_obj(obj):
    """Redact every string inside a JSON-like structure."""
    if isinstance(obj, str):
        return redact(obj)
    if isinstance(obj, dict):
        return {k: redact_obj(v) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return [redact_obj(v) for v in obj]
    return obj
