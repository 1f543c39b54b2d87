"""Every encoding a tool or an attacker prints a credential in, and what must not be found afterwards.

Standard library only and independent of ``domain.redact``: the e2e test runs this very file inside the
build job (tests/e2e/test_sentinel_encodings_e2e.py) to print the forms, the unit tests and bench/redaction.py feed them to
``redact``, and both search for the needles below. A needle is a form as printed, or for a form that mixes
with its neighbours (a token inside a longer base64 stream, a wrapped stream, a token cut in two) the
part that stays the same whatever surrounds it.
"""

from __future__ import annotations

import base64
import json
import re
from urllib.parse import quote, quote_plus

WRAP = 20  # a wrapped base64 stream's line length (``base64 -w 20``): the token's base64 spans lines


def _pct_lower(s: str) -> str:
    return re.sub(r"%[0-9A-F]{2}", lambda m: m.group(0).lower(), s)


def _stream_core(prefix: bytes, token: bytes) -> tuple[str, int, int]:
    """base64 of ``prefix + token + b"!"`` and the span of its characters that depend on the token only."""
    stream = base64.b64encode(prefix + token + b"!").decode()
    first = -(-len(prefix) * 8 // 6) + 1
    last = (len(prefix) + len(token)) * 8 // 6 - 1
    return stream, first, last


def forms(token: str, user: str = "robot") -> dict[str, str]:
    """name -> the text a tool prints (one or more lines)."""
    raw = token.encode()
    half = len(token) // 2
    b64 = base64.b64encode(raw).decode()
    pairs = [f"{b:02x}" for b in raw]
    out = {
        "raw": token,
        "hex_lower": "".join(pairs), "hex_upper": "".join(pairs).upper(), "hex_colon": ":".join(pairs),
        "hex_space_upper": " ".join(pairs).upper(), "hex_escape": "".join(f"\\x{p}" for p in pairs),
        "pct_upper": quote(token, safe=""), "pct_lower": _pct_lower(quote(token, safe="")),
        "pct_every_byte": "".join(f"%{p}" for p in pairs), "pct_double": quote(quote(token, safe=""), safe=""),
        "pct_double_lower": _pct_lower(quote(quote(token, safe=""), safe="")), "quote_plus": quote_plus(token),
        "json_slash": json.dumps(token).replace("/", "\\/"),
        "json_u002b": json.dumps(token).replace("+", "\\u002b").replace("/", "\\u002F"),
        "json_u_every_char": '"' + "".join(f"\\u{ord(c):04x}" for c in token) + '"',
        "split_newline": token[:half] + "\n" + token[half:],
        "split_indented": token[:half] + "\n        " + token[half:],
        "split_continuation": token[:half] + "\\\n    " + token[half:],
        "b64": b64, "b64_nopad": b64.rstrip("="),
        "urlsafe": base64.urlsafe_b64encode(raw).decode(),
        "urlsafe_nopad": base64.urlsafe_b64encode(raw).decode().rstrip("="),
        "b64_json_slash": json.dumps(b64).replace("/", "\\/"),
        "b64_pct_lower": _pct_lower(quote(b64, safe="")),
    }
    for k in (0, 1, 2):
        out[f"basic_{k}"] = base64.b64encode(("x" * k + user + ":" + token).encode()).decode()
    stream, _, _ = _stream_core(b"docker-config-prefix:", raw)
    out["b64_wrapped"] = "\n".join(stream[i:i + WRAP] for i in range(0, len(stream), WRAP))
    return out


def needles(token: str, user: str = "robot") -> dict[str, list[str]]:
    """name -> strings none of which may remain after redaction (each at least 10 characters)."""
    printed = forms(token, user)
    raw = token.encode()
    half = len(token) // 2
    out: dict[str, list[str]] = {}
    for name, text in printed.items():
        if name.startswith("split_"):
            out[name] = [text, token[:half], token[half:]]
        elif name.startswith("basic_"):
            stream, first, last = _stream_core(("x" * int(name[-1]) + user + ":").encode(), raw)
            out[name] = [stream[first:last]]
        elif name == "b64_wrapped":
            stream, first, last = _stream_core(b"docker-config-prefix:", raw)
            lines = [(i, stream[i:i + WRAP]) for i in range(0, len(stream), WRAP)]
            out[name] = [line for i, line in lines if i >= first and i + len(line) <= last]
            assert out[name], "the wrapped stream holds no whole line of the token's base64"
        else:
            out[name] = [text]
    assert all(len(n) >= 10 for ns in out.values() for n in ns), out
    return out

