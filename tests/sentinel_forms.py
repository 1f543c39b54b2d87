"""Every encoding a tool or an attacker prints a credential in, and what must not be found afterwards.

Standard library only and independent of ``domain.redact``: the e2e test runs this very file inside the
build job (tests/e2e/test_sentinel_encodings_e2e.py) to print the forms, the unit tests and bench/redaction.py feed them to
``redact``, and both search for the needles below. A needle is a form as printed, or for a form that mixes
with its neighbours (a token inside a longer base64 stream, a wrapped stream, a token cut in two) the
part that stays the same whatever surrounds it.
"""

from __future__ import annotations

import base64
import gzip
import json
import re
from urllib.parse import quote, quote_plus

WRAP = 20  # a wrapped base64 stream's line length (``base64 -w 20``): the token's base64 spans lines
# What ``iris job logs`` puts before each line; a viewer wrapping at 80 or 120 columns repeats it on the
# continuation lines (or not: a terminal's own wrap), with the token's first 7-9 characters on the first.
IRIS_PREFIX = "[12:00:01] task=/gpu-rl/amd64-std/0 attempt=0 | "
# name -> (columns, characters of the token on the first line, whether continuation lines repeat the prefix)
WRAPS = {"iris_wrap80": (80, 8, True), "iris_wrap120": (120, 9, True), "iris_wrap80_bare": (80, 7, False)}
DUMPED = b"token: "  # what the dumped file holds before the token (so the token starts mid-line)


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
    out |= _decoded_forms(token, user)
    return out


def _docker_config(token: str, user: str) -> tuple[bytes, bytes, bytes]:
    """A Kubernetes ``.dockerconfigjson`` split around the part of its ``auth`` that depends on the token
    only: (before, token-only base64, after)."""
    auth, first, last = _stream_core(user.encode() + b":", token.encode())
    inner = auth[first:last]
    head = json.dumps({"auths": {"ghcr.io": {"username": user, "auth": "@"}}}).split("@")
    return (head[0] + auth[:first]).encode(), inner.encode(), (auth[last:] + head[1]).encode()


def _iris_wrap(token: str, width: int, head: int, prefixed: bool) -> tuple[str, list[str]]:
    """A log line ``IRIS_PREFIX … token …`` wrapped at ``width`` columns with ``head`` characters of the
    token on the first line; continuation lines repeat the prefix when ``prefixed``. Also the token's
    piece on each line."""
    lead = IRIS_PREFIX + "pushing with " + "-" * (width - len(IRIS_PREFIX) - len("pushing with ") - head)
    line = lead + token + " and the push goes on"
    cuts, room = [width], width - len(IRIS_PREFIX) if prefixed else width
    while cuts[-1] < len(line):
        cuts.append(cuts[-1] + room)
    chunks = [line[a:b] for a, b in zip([0, *cuts], cuts, strict=False) if a < len(line)]
    text = "\n".join([chunks[0], *(((IRIS_PREFIX if prefixed else "") + c) for c in chunks[1:])])
    t0 = len(lead)
    pieces = [token[max(a, t0) - t0:min(b, t0 + len(token)) - t0] for a, b in zip([0, *cuts], cuts, strict=False)
              if max(a, t0) < min(b, t0 + len(token))]
    return text, pieces


def _dump_lines(token: str, kind: str) -> list[tuple[str, str, bool]]:
    """A hex dump of ``DUMPED + token + newline`` as a tool prints it, per line: (hex part, ASCII column,
    whether the line's 16 bytes are all the token's)."""
    data = DUMPED + token.encode() + b"\n"
    start, end = len(DUMPED), len(DUMPED) + len(token)
    out = []
    for off in range(0, len(data), 16):
        chunk = data[off:off + 16]
        if kind == "xxd":
            hexpart = " ".join(chunk[i:i + 2].hex() for i in range(0, len(chunk), 2))
        elif kind == "xxd_g1":
            hexpart = " ".join(f"{b:02x}" for b in chunk)
        elif kind == "xxd_e":  # xxd -e: little-endian 4-byte words
            hexpart = " ".join(chunk[i:i + 4][::-1].hex() for i in range(0, len(chunk), 4))
        elif kind == "od_x":  # od -x: little-endian 2-byte words
            padded = chunk + b"\0" * (len(chunk) % 2)
            hexpart = " ".join(padded[i:i + 2][::-1].hex() for i in range(0, len(padded), 2))
        else:  # hexdump -C
            hexpart = " ".join(f"{b:02x}" for b in chunk[:8]) + "  " + " ".join(f"{b:02x}" for b in chunk[8:])
        ascii_col = "".join(chr(b) if 32 <= b < 127 else "." for b in chunk)
        out.append((hexpart, ascii_col, start <= off and off + 16 <= end))
    return out


def _dump(token: str, kind: str) -> str:
    lines = []
    for n, (hexpart, ascii_col, _) in enumerate(_dump_lines(token, kind)):
        if kind.startswith("xxd"):
            lines.append(f"{n * 16:08x}: {hexpart:<40}  {ascii_col}")
        elif kind == "od_x":
            lines.append(f"{n * 16:07o} {hexpart}")
        else:
            lines.append(f"{n * 16:08x}  {hexpart:<49}  |{ascii_col}|")
    return "\n".join(lines)


def _qp(token: str) -> tuple[str, str]:
    """The token quoted-printable (``=`` as ``=3D``), cut by a soft line break: (head, tail)."""
    enc = "".join(c if 33 <= ord(c) < 127 and c != "=" else f"={ord(c):02X}" for c in token)
    cut = 12 if enc[11] != "=" and enc[10] != "=" else 14
    return enc[:cut], enc[cut:]


def _decoded_forms(token: str, user: str) -> dict[str, str]:
    """Forms found only by decoding first (issue #36 item 2): nested base64, base32, gzip, UTF-16, hex
    dumps, octal escapes, ANSI colour codes, quoted-printable, wrapped ``iris job logs`` lines."""
    raw = token.encode()
    before, inner, after = _docker_config(token, user)
    head, tail = _qp(token)
    out = {
        "dockerconfigjson_b64": base64.b64encode(before + inner + after).decode(),
        "b64_double": base64.b64encode(base64.b64encode(raw)).decode(),
        "base32": base64.b32encode(raw).decode(),
        "gzip_b64": base64.b64encode(gzip.compress(raw, mtime=0)).decode(),
        "utf16le_hex": token.encode("utf-16-le").hex(),
        "utf16be_hex": token.encode("utf-16-be").hex(),
        "utf16le_b64": base64.b64encode(token.encode("utf-16-le")).decode(),
        "octal_escape": "".join(f"\\{b:03o}" for b in raw),
        "ansi_split": f"\x1b[1m{token[:12]}\x1b[31m{token[12:]}\x1b[0m",
        "quoted_printable": "x" * 58 + " " + head + "=\n" + tail,
    }
    out |= {name: _iris_wrap(token, *args)[0] for name, args in WRAPS.items()}
    for kind in ("xxd", "xxd_g1", "xxd_e", "od_x", "hexdump_c"):
        out[kind] = _dump(token, kind)
    return out


def _decoded_needles(token: str, user: str, name: str, printed: str) -> list[str]:
    raw = token.encode()
    if name == "dockerconfigjson_b64":
        before, inner, _ = _docker_config(token, user)
        stream, first, last = _stream_core(before, inner)
        return [stream[first:last]]
    if name == "b64_double":
        stream, first, last = _stream_core(b"", base64.b64encode(raw)[1:-4])
        return [printed, stream[first + 4:last - 4]]
    if name == "base32":
        return [printed[:len(raw) // 5 * 8]]
    if name in ("gzip_b64", "utf16le_hex", "utf16be_hex", "octal_escape"):
        return [printed[14:] if name == "gzip_b64" else printed]
    if name == "utf16le_b64":
        stream, first, last = _stream_core(b"", token.encode("utf-16-le"))
        return [stream[first:last]]
    if name == "ansi_split":
        return [token[:12], token[12:]]
    if name == "quoted_printable":
        return [part for part in _qp(token) if len(part) >= 10]
    if name.startswith("iris_wrap"):  # the head (7-9 characters) is too short to be known alone
        width, head, prefixed = WRAPS[name]
        pieces = _iris_wrap(token, width, head, prefixed)[1]
        assert len(pieces[0]) == head
        return [token] + [p for p in pieces[1:] if len(p) >= 10]
    lines = _dump_lines(token, name)  # a dump: the hex and the ASCII column of each line all of the token's
    return [x for hexpart, ascii_col, inside in lines if inside for x in (hexpart, ascii_col)]


_DECODED = frozenset(_decoded_forms("x" * 40, "robot"))


def head_needles(token: str) -> dict[str, list[str]]:
    """name -> needles of a wrapped form that only a sink holding the lines together can redact: the
    first line's end with the token's 7-9 character head (a one-line sink cannot know what follows)."""
    out = {}
    for name, (width, head, prefixed) in WRAPS.items():
        first = _iris_wrap(token, width, head, prefixed)[0].split("\n", 1)[0]
        out[name] = [first[-(head + 4):]]
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
        elif name in _DECODED:
            out[name] = _decoded_needles(token, user, name, text)
        elif name == "b64_wrapped":
            stream, first, last = _stream_core(b"docker-config-prefix:", raw)
            lines = [(i, stream[i:i + WRAP]) for i in range(0, len(stream), WRAP)]
            out[name] = [line for i, line in lines if i >= first and i + len(line) <= last]
            assert out[name], "the wrapped stream holds no whole line of the token's base64"
        else:
            out[name] = [text]
    assert all(len(n) >= 10 for ns in out.values() for n in ns), out
    return out

