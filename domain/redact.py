"""Process-wide secret redaction, in every encoding a secret travels in.

Every secret fetched at execution time is registered here, and every log line, diagnostics file,
activity result, heartbeat and error message that leaves our code passes through ``redact``. It is a
second line of defence: the first is never putting a secret into anything but a job env var or an
HTTP header.

What a build log, a tool or an attacker prints instead of the raw value, and how each is found:

- literal forms (``encoded_forms``): raw; base64 standard or URL-safe, padded or not, alone or inside a
  longer stream such as ``base64(user:token)`` of a ``Basic`` header or a docker ``config.json`` (a secret
  inside a stream starts at one of three byte alignments; for each, the characters that depend only on
  its bytes are fixed, so those cores are literals); hex in either case, bare or separated by ``:``,
  ``-`` or spaces;
- escapes, in any mix and either case, decoded in a view of the text that maps back to it: percent
  (``%2f``, ``%2F``, of every byte or some; doubled ``%252F`` by decoding the view again), JSON (``\\/``,
  ``\\u002b``, ``\\u00XX`` of any character, ``\\\\``), ``\\xXX`` and HTML character references;
- a form cut by line breaks (a newline or its JSON escape, a ``\\`` continuation, indentation, the
  ``[task stream]`` prefix of our own log files; a wrapped base64 stream): a match is extended across them;
- a part of a form, at least ``MIN_PART`` characters, standing alone (no letter or digit on either side:
  the line of a cut token that a one-line sink holds, a truncated token, one line of a wrapped stream).

Why one Aho-Corasick automaton (``pyahocorasick``): ``redact`` runs on every log line, heartbeat and
payload, and each secret has ~25 literal forms. The automaton holds ``MIN_PART``-character anchors taken
every ``STRIDE`` characters of every form and finds them all in one pass over the text; a hit is then
extended both ways against its form (rare: only where a secret is). A ``str.find`` per form, which this
module did before, costs one pass per form, and an ``re`` alternation of the anchors is slower still
(bench/redaction.py, docs/benchmarks.md). The automaton is rebuilt at the first ``redact`` after a batch
of registrations and swapped in whole, so ``redact`` takes no lock. Why the standard library for the
encoders (``base64``, ``urllib.parse``): they are the encoders the leaking tools use.
"""

from __future__ import annotations

import base64
import bisect
import re
import threading
from typing import NamedTuple
from urllib.parse import quote, quote_plus

import ahocorasick

_lock = threading.Lock()
_secrets: dict[str, tuple[str, ...]] = {}  # secret -> every literal form searched for, longest first
REDACTED = "[REDACTED]"
# A base64 core shorter than this is not searched for (it would match ordinary text by chance).
MIN_CORE_CHARS = 8
# A part of a form (cut by a truncation, or the one line of a cut token a sink holds) at least this long,
# standing alone, is redacted. Also the length of the automaton's anchors.
MIN_PART = 10
# Anchors are taken every STRIDE characters of a single-line form (and its last MIN_PART): any run of a
# form STRIDE + MIN_PART - 1 characters long holds one (one line of a wrapped base64 stream, a token cut
# at both ends); a hit is then extended both ways while the text agrees with the form.
STRIDE = 8
# Shapes of well-known tokens, redacted even if never registered.
_TOKEN_PREFIXES = ("ghp_", "gho_", "ghs_", "ghu_", "ghr_", "github_pat_", "dckr_pat_")
_TOKEN_SHAPES = re.compile(r"(ghp_|gho_|ghs_|ghu_|ghr_|github_pat_|dckr_pat_)[A-Za-z0-9_]{16,}")
# Header shapes that carry credentials (``Authorization: Basic …``, JSON ``"authorization": "Bearer …"``).
_AUTH_HEADER = re.compile(
    r"(?i)(authorization[\"']?\s*[:=]\s*[\"']?)(bearer|basic|token)\s+[A-Za-z0-9._~+/=%-]+")
# ``"auth": "<base64>"`` of a docker config.json.
_DOCKER_AUTH = re.compile(r"(?i)(\"auth\"\s*:\s*\")[A-Za-z0-9+/=_-]{8,}(\")")


# ``NAME=value`` where the name says it holds a credential (a build that prints its environment).
_SECRET_WORDS = ("token", "passw", "secret", "api_key", "access_key", "private_key", "credential")
_SECRET_ASSIGNMENT = re.compile(
    r"(?i)\b([A-Z0-9_]*(?:TOKEN|PASSWORD|PASSWD|SECRET|API_KEY|ACCESS_KEY|PRIVATE_KEY|CREDENTIALS?)[A-Z0-9_]*)"
    r"=(?!\[REDACTED\])(\S+)")

# One escape of the decoded view, of an ASCII character only (the forms searched for are ASCII; a JSON
# document's escaped non-ASCII text, such as a progress bar's, is left alone). Groups: 1 %XX, 2 \u00XX,
# 3 \xXX, 4 \/ or \\, 5 &#xH;, 6 &#D;.
_ESCAPE = re.compile(r"%([0-7][0-9A-Fa-f])|\\u(00[0-7][0-9A-Fa-f])|\\x([0-7][0-9A-Fa-f])|\\([/\\])"
                     r"|&#[xX]0*([0-7]?[0-9A-Fa-f]);|&#0*([0-9]{1,3});")
# A line break inside a cut token: a newline (or its JSON escape), after an optional ``\`` continuation,
# with the indentation or the ``[task stream]`` prefix of our own log files that follows it.
_BREAK_RE = r"\\?(?:\r?\n|\\r\\n|\\n)(?:[ \t]*\[[^\]\n]{1,100}\] ?)?[ \t]*"
_BREAK = re.compile(_BREAK_RE)
_BREAK_BEFORE = re.compile(f"(?:{_BREAK_RE})\\Z")
_HEX_SEPARATORS = ("", ":", "-", " ")


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
    """Every literal form of ``secret`` that ``redact`` searches for, longest first (escapes and line
    breaks are not enumerated here: escapes are decoded in the text's view, breaks crossed)."""
    raw = secret.encode()
    forms = {secret, quote(secret, safe=""), quote(secret), quote_plus(secret)}
    for enc in (base64.b64encode, base64.urlsafe_b64encode):
        whole = enc(raw).decode()
        forms |= {whole, whole.rstrip("=")}
    forms |= base64_cores(raw)
    pairs = [f"{b:02x}" for b in raw]
    for sep in _HEX_SEPARATORS:
        forms |= {sep.join(pairs), sep.join(pairs).upper()}
    return tuple(sorted((f for f in forms if f), key=len, reverse=True))


class _Matcher(NamedTuple):
    """One immutable snapshot: the automaton of anchors and the forms they point into."""

    automaton: ahocorasick.Automaton
    forms: tuple[str, ...]


_matcher: _Matcher | None = None
_stale = False


def _anchors(form: str) -> set[int]:
    if len(form) <= MIN_PART:
        return {0}
    last = len(form) - MIN_PART
    if "\n" in form or len(form) > 512:  # a PEM key (and its encodings): its lines are registered one by
        return {0, last}                  # one and anchored there; a whole form is still found by its ends
    return {*range(0, last, STRIDE), last}


def _build() -> _Matcher | None:
    forms = sorted({f for fs in _secrets.values() for f in fs})
    words: dict[str, list[tuple[int, int]]] = {}
    for k, form in enumerate(forms):
        for i in _anchors(form):
            words.setdefault(form[i:i + MIN_PART], []).append((k, i))
    if not words:
        return None
    automaton = ahocorasick.Automaton()
    for word, entries in words.items():
        automaton.add_word(word, (len(word), tuple(entries)))
    automaton.make_automaton()
    return _Matcher(automaton, tuple(forms))


def register_secret(value: str) -> None:
    """Redact ``value`` from now on. The automaton is rebuilt once, at the next ``redact``, however
    many secrets a batch (``learn_secrets``) registers."""
    global _stale
    if value and len(value) >= 4:
        with _lock:
            if value not in _secrets:
                _secrets[value] = encoded_forms(value)
                _stale = True


def registered_secrets() -> list[str]:
    """The raw values registered so far (for callers that must keep them out of a child's environment)."""
    with _lock:
        return list(_secrets)


def _current() -> _Matcher | None:
    global _matcher, _stale
    if _stale:
        with _lock:
            if _stale:
                _matcher, _stale = _build(), False
    return _matcher


def _unescape(m: re.Match) -> str:
    g = m.lastindex
    if g == 4:
        return m.group(4)
    code = int(m.group(g), 10 if g == 6 else 16)
    return chr(code) if code < 128 else m.group(0)


class _View(NamedTuple):
    """A text with its escapes decoded; ``segments`` maps it back: one ``(view_start, view_len,
    text_start, text_len)`` per escape, in order."""

    text: str
    starts: list[int]
    segments: list[tuple[int, int, int, int]]

    def span(self, start: int, end: int) -> tuple[int, int]:
        """The source span of the view's ``[start, end)``, whole escapes included."""
        return self._at(start)[0], self._at(end - 1)[1]

    def _at(self, i: int) -> tuple[int, int]:
        k = bisect.bisect_right(self.starts, i) - 1
        if k < 0:
            return i, i + 1
        v0, vlen, t0, tlen = self.segments[k]
        if i < v0 + vlen:
            return t0, t0 + tlen
        t = t0 + tlen + (i - v0 - vlen)
        return t, t + 1


def _view(text: str) -> _View:
    """``text`` decoded with its map back (built only when the decoded text holds a secret)."""
    pieces: list[str] = []
    segments: list[tuple[int, int, int, int]] = []
    last = n = 0
    for m in _ESCAPE.finditer(text):
        s, e = m.span()
        out = _unescape(m)
        pieces += [text[last:s], out]
        n += s - last
        segments.append((n, len(out), s, e - s))
        n += len(out)
        last = e
    pieces.append(text[last:])
    return _View("".join(pieces), [s[0] for s in segments], segments)


def _extend(text: str, a: int, b: int, form: str, i: int, j: int) -> tuple[int, int, int, int]:
    """Grow ``text[a:b] == form[i:j]`` both ways while the text agrees with the form, crossing line
    breaks (a token cut across lines, a wrapped base64 stream)."""
    n = len(text)
    while j < len(form):
        if b < n and text[b] == form[j]:
            b, j = b + 1, j + 1
            continue
        m = _BREAK.match(text, b)
        if m is None or m.end() >= n or text[m.end()] != form[j]:
            break
        b = m.end()
    while i > 0:
        if a > 0 and text[a - 1] == form[i - 1]:
            a, i = a - 1, i - 1
            continue
        m = _BREAK_BEFORE.search(text, max(0, a - 120), a)
        if m is None or m.start() == 0 or text[m.start() - 1] != form[i - 1]:
            break
        a = m.start()
    return a, b, i, j


def _hits(text: str, m: _Matcher) -> list[tuple[int, int]]:
    """Spans of ``text`` holding a whole form, or a part of one at least MIN_PART long that stands alone
    (no letter or digit right before or after it: not ten characters inside a longer word, such as the
    end of a digest that happens to end like a secret)."""
    spans: list[tuple[int, int]] = []
    done: set[tuple[int, int]] = set()  # (form, start) already extended: one extension per occurrence
    for end, (length, entries) in m.automaton.iter(text):
        start = end - length + 1
        for k, i in entries:
            if (k, start - i) in done:
                continue
            form = m.forms[k]
            a, b, i0, j0 = _extend(text, start, end + 1, form, i, i + length)
            done.add((k, start - i))
            whole = i0 == 0 and j0 == len(form)
            if whole or (j0 - i0 >= MIN_PART and (a == 0 or not text[a - 1].isalnum())
                         and (b == len(text) or not text[b].isalnum())):
                spans.append((a, b))
    return spans


def _secret_spans(text: str, m: _Matcher) -> list[tuple[int, int]]:
    """Every span of ``text`` that holds a secret: found in the text, in its decoded view and in the
    view of that view (doubled escapes), mapped back to the text."""
    spans = _hits(text, m)
    if _ESCAPE.search(text) is None:
        return spans
    once = _ESCAPE.sub(_unescape, text)
    found = _hits(once, m)
    twice = _ESCAPE.sub(_unescape, once) if _ESCAPE.search(once) else None
    found2 = _hits(twice, m) if twice is not None else []
    if found or found2:
        first = _view(text)
        spans += [first.span(a, b) for a, b in found]
        if found2:
            second = _view(once)
            spans += [first.span(*second.span(a, b)) for a, b in found2]
    return spans


def redact(text: str) -> str:
    if not text:
        return text
    m = _current()
    if m is not None:
        spans = _secret_spans(text, m)
        if spans:
            out, pos = [], 0
            for a, b in sorted(spans):
                if b <= pos:
                    continue
                if a >= pos:
                    out += [text[pos:a], REDACTED]
                pos = b
            out.append(text[pos:])
            text = "".join(out)
    if any(p in text for p in _TOKEN_PREFIXES):
        text = _TOKEN_SHAPES.sub(REDACTED, text)
    lowered = text.lower() if "=" in text else ""
    if any(w in lowered for w in _SECRET_WORDS):  # the regex alone runs at ~3 MB/s: only where it can match
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
