"""Process-wide secret redaction, in every encoding a secret travels in.

Every secret fetched at execution time is registered here, and every log line, diagnostics file,
activity result, heartbeat and error message that leaves our code passes through ``redact``. It is a
second line of defence: the first is never putting a secret into anything but a job env var or an
HTTP header.

A build log does not only print a token raw: ``env``, curl traces and registry clients print it
URL-encoded (``quote``/``quote_plus``), base64 (standard or URL-safe, padded or not), and as
``base64(user:token)`` inside a ``Basic`` header or a ``~/.docker/config.json`` ``auth`` field. A
secret inside a longer base64 stream starts at one of three byte alignments; for each, the base64
characters that depend only on the secret's bytes are fixed (the edge characters mix with the
neighbouring bytes), so those cores are searched for as well. Why the standard library
(``base64``, ``urllib.parse``): these are exactly the encoders the leaking tools use.
"""

from __future__ import annotations

import base64
import re
import threading
from urllib.parse import quote, quote_plus

_lock = threading.Lock()
_secrets: dict[str, tuple[str, ...]] = {}  # secret -> every form searched for, longest first
REDACTED = "[REDACTED]"
# A base64 core shorter than this is not searched for (it would match ordinary text by chance).
MIN_CORE_CHARS = 8
# Shapes of well-known tokens, redacted even if never registered.
_TOKEN_SHAPES = re.compile(r"(ghp_|gho_|ghs_|ghu_|ghr_|github_pat_|dckr_pat_)[A-Za-z0-9_]{16,}")
# Header shapes that carry credentials (``Authorization: Basic …``, JSON ``"authorization": "Bearer …"``).
_AUTH_HEADER = re.compile(
    r"(?i)(authorization[\"']?\s*[:=]\s*[\"']?)(bearer|basic|token)\s+[A-Za-z0-9._~+/=%-]+")
# ``"auth": "<base64>"`` of a docker config.json.
_DOCKER_AUTH = re.compile(r"(?i)(\"auth\"\s*:\s*\")[A-Za-z0-9+/=_-]{8,}(\")")


# ``NAME=value`` where the name says it holds a credential (a build that prints its environment).
_SECRET_ASSIGNMENT = re.compile(
    r"(?i)\b([A-Z0-9_]*(?:TOKEN|PASSWORD|PASSWD|SECRET|API_KEY|ACCESS_KEY|PRIVATE_KEY|CREDENTIALS?)[A-Z0-9_]*)"
    r"=(?!\[REDACTED\])(\S+)")


def base64_cores(data: bytes) -> set[str]:
    """The base64 characters (standard and URL-safe) that encode ``data`` wherever it sits in a longer
    stream: one core per byte alignment (offset 0, 1, 2 modulo 3), edge characters trimmed."""
    cores: set[str] = set()
    n = len(data)
    for k in (0, 1, 2):
        encoded = base64.b64encode(b"\0" * k + data).decode()
        # Character j covers bits 6j..6j+5 of the stream; the secret covers bits 8k..8(k+n)-1.
        first = -(-8 * k // 6)
        last = (8 * (k + n) - 6) // 6
        core = encoded[first:last + 1]
        if len(core) >= MIN_CORE_CHARS:
            cores.add(core)
            cores.add(core.replace("+", "-").replace("/", "_"))
    return cores


def encoded_forms(secret: str) -> tuple[str, ...]:
    """Every form of ``secret`` that ``redact`` replaces, longest first."""
    raw = secret.encode()
    forms = {secret, quote(secret, safe=""), quote(secret), quote_plus(secret)}
    for enc in (base64.b64encode, base64.urlsafe_b64encode):
        whole = enc(raw).decode()
        forms |= {whole, whole.rstrip("=")}
    forms |= base64_cores(raw)
    return tuple(sorted((f for f in forms if f), key=len, reverse=True))


def register_secret(value: str) -> None:
    if value and len(value) >= 4:
        with _lock:
            if value not in _secrets:
                _secrets[value] = encoded_forms(value)


def registered_secrets() -> list[str]:
    """The raw values registered so far (for callers that must keep them out of a child's environment)."""
    with _lock:
        return list(_secrets)


def redact(text: str) -> str:
    if not text:
        return text
    with _lock:
        forms = sorted({f for fs in _secrets.values() for f in fs}, key=len, reverse=True)
    for f in forms:
        if f in text:
            text = text.replace(f, REDACTED)
    text = _TOKEN_SHAPES.sub(REDACTED, text)
    text = _SECRET_ASSIGNMENT.sub(lambda m: f"{m.group(1)}={REDACTED}", text)
    text = _DOCKER_AUTH.sub(lambda m: f"{m.group(1)}{REDACTED}{m.group(2)}", text)
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


def redact_value(value):
    """``value`` (a pydantic model, JSON-like data or a string) with every string redacted; the same
    object when nothing needed redacting, so results without secrets pass through untouched."""
    from pydantic import BaseModel

    if isinstance(value, BaseModel):
        dumped = value.model_dump(mode="json")
        cleaned = redact_obj(dumped)
        return value if cleaned == dumped else type(value).model_validate(cleaned)
    if isinstance(value, list) and value and all(isinstance(v, BaseModel) for v in value):
        return [redact_value(v) for v in value]
    if isinstance(value, str | dict | list | tuple):
        cleaned = redact_obj(value)
        return value if cleaned == value else cleaned
    return value
