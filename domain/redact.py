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

Decoded before matching (``_spans``): ANSI/VT sequences and control characters are removed in a view
first (a token split by colour codes; UTF-16 read as bytes); then runs of base64 (every alignment, joined
across wrapped and prefixed lines), base32 and hex (any grouping and byte order: xxd, od -x, hexdump -C)
are decoded, a gzip stream inflated, and what reads as text is searched again, ``DEPTH`` layers deep;
octal escapes and quoted-printable are decoded in the escape view, and a break may carry an ``iris job
logs`` prefix. Each layer maps its hits back to the text's own characters, so only the secret's span is
replaced (a commit SHA or a digest beside it stays). Every sink uses this one function: the activity
boundary and the payload codec (Temporal), the evidence store, the worker log, PR and issue bodies
(clients/github.py) and the terminal (domain/terminal_text.py strips escapes first, then redacts).

Why one Aho-Corasick automaton (``ahocorasick_rs``: Rust's ``aho-corasick`` crate, 3x ``pyahocorasick``
over a 1.4 MB log with ~7,000 anchors): ``redact`` runs on every log line, heartbeat and payload, and each
secret has ~25 literal forms. The automaton holds ``MIN_PART``-character anchors taken
every ``STRIDE`` characters of every form and finds them all in one pass over the text; a hit is then
extended both ways against its form (rare: only where a secret is). A ``str.find`` per form, which this
module did before, costs one pass per form, and an ``re`` alternation of the anchors is slower still
(bench/redaction.py, docs/benchmarks.md). The automaton is rebuilt at the first ``redact`` after a batch
of registrations and swapped in whole, so ``redact`` takes no lock. Why the standard library for the
encoders (``base64``, ``urllib.parse``): they are the encoders the leaking tools use.

What keeps a 1.4 MB log within its budget (bench/redaction.py): every whole-text look is one C-speed pass
and the Python work is spent only where something may be. Substring checks and the scans for candidate
runs (base64, hex areas) read the text as one byte per character (``_latin``: ``bytes.find`` on a
translated copy, where a character-class regex restarts at every letter of every word); the escape view
is decoded chunk by chunk and a chunk's map back is built only when a hit falls in it, a second decoding
only in the chunks holding a doubled escape; base64 runs are read by position only on the lines that hold
one that decodes to something or continues on the next line; the case-insensitive patterns run only
where their words are.
"""

from __future__ import annotations

import base64
import bisect
import itertools
import re
import string
import threading
import zlib
from collections.abc import Iterable
from typing import NamedTuple
from urllib.parse import quote, quote_plus

import ahocorasick_rs

# Re-entrant: ``redact`` runs inside logging, and logging can run inside ``_current``'s rebuild. An
# allocation there may start the garbage collector, whose finalizers log (asyncio's "Task was destroyed but
# it is pending" goes through ``call_exception_handler`` -> logging -> ``redact``). With a plain Lock that
# nested call waited for the lock its own thread held: a CI run hung for good in a workflow test's
# activity log line (``_build`` -> GC -> ``loop.call_exception_handler`` -> ``redact`` -> ``_current``).
_lock = threading.RLock()
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
STRIDE = 6
# Shapes of well-known tokens, redacted even if never registered.
_TOKEN_PREFIXES = ("ghp_", "gho_", "ghs_", "ghu_", "ghr_", "github_pat_", "dckr_pat_")
_TOKEN_PREFIXES_B = tuple(p.encode() for p in _TOKEN_PREFIXES)
_TOKEN_PREFIX = re.compile(b"|".join(_TOKEN_PREFIXES_B))
_TOKEN_SHAPES = re.compile(r"(ghp_|gho_|ghs_|ghu_|ghr_|github_pat_|dckr_pat_)[A-Za-z0-9_]{16,}")
# Header shapes that carry credentials (``Authorization: Basic …``, JSON ``"authorization": "Bearer …"``).
_AUTH_HEADER = re.compile(
    r"(?i)(authorization[\"']?\s*[:=]\s*[\"']?)(bearer|basic|token)\s+[A-Za-z0-9._~+/=%-]+")
# ``"auth": "<base64>"`` of a docker config.json.
_DOCKER_AUTH = re.compile(r"(?i)(\"auth\"\s*:\s*\")[A-Za-z0-9+/=_-]{8,}(\")")


# ``NAME=value`` where the name says it holds a credential (a build that prints its environment).
_SECRET_WORDS = (b"token", b"passw", b"secret", b"api_key", b"access_key", b"private_key", b"credential")
_SECRET_WORD = re.compile(b"|".join(_SECRET_WORDS))


def _holds(data: bytes, words: tuple[bytes, ...], pattern: re.Pattern) -> bool:
    """``data`` holds one of ``words`` (``pattern``: their alternation): one search on a short text, a
    substring check each on a long one (there the alternation is slower where its first letters are common)."""
    return pattern.search(data) is not None if len(data) < 4096 else any(w in data for w in words)
# The characters ``re`` matches to an ASCII letter ignoring case (İ ı ſ K): where one is, no lowered gate.
_FOLDS = re.compile("[\u0130\u0131\u017f\u212a]")
_SECRET_ASSIGNMENT = re.compile(
    r"(?i)\b([A-Z0-9_]*(?:TOKEN|PASSWORD|PASSWD|SECRET|API_KEY|ACCESS_KEY|PRIVATE_KEY|CREDENTIALS?)[A-Z0-9_]*)"
    r"=(?!\[REDACTED\])(\S+)")

# One escape of the decoded view, of an ASCII character only (the forms searched for are ASCII; a JSON
# document's escaped non-ASCII text, such as a progress bar's, is left alone). Groups: 1 %XX, 2 \u00XX,
# 3 \xXX, 4 \/ or \\, 5 &#xH;, 6 &#D;, 7 an octal escape \NNN, 8 quoted-printable =XX, 9 its soft line
# break (``=`` at a line's end: removed).
_ESCAPE_RE = (r"%([0-7][0-9A-Fa-f])|\\u(00[0-7][0-9A-Fa-f])|\\x([0-7][0-9A-Fa-f])|\\([/\\])"
              r"|&#[xX]0*([0-7]?[0-9A-Fa-f]);|&#0*([0-9]{1,3});")
_ESCAPE = re.compile(_ESCAPE_RE)
# With octal escapes and quoted-printable too: used only where the text holds one (``=`` is frequent in
# logs, and each alternative costs every match attempt).
_ESCAPE_FULL = re.compile(_ESCAPE_RE + r"|\\([01][0-7]{2})|=([0-7][0-9A-F])|(=\r?\n)")
# The escapes that need more than the plain escape view, all found by one scan of the text's bytes: octal
# and quoted-printable (``_ESCAPE_FULL``); one that may decode to a control character (the view is then
# searched with control sequences removed); one that may decode to an escape (a second decoding of its
# chunk). ``\\`` before a backslash stands for a doubled backslash and leaves that backslash to the next.
_MARKS = re.compile(rb"=(?:\n|\r\n|\\n|3D|20)|\\(?:u005|u00|x|0|1|(?=\\))|%(?:25|5C|5c|0|1)|&(?:amp;|#)")
_FULL_MARKS = frozenset((b"=\n", b"=\r\n", b"=\\n", b"=3D", b"=20", b"\\0", b"\\1"))
_CONTROL_MARKS = frozenset((b"\\u00", b"\\u005", b"\\x", b"%0", b"%1", b"&#", b"\\0"))
_DOUBLED_MARKS = frozenset((b"%25", b"\\", b"%5C", b"%5c", b"&amp;", b"\\u005"))
# A line break inside a cut token: a newline (or its JSON escape), after an optional ``\`` continuation,
# with the indentation or the ``[task stream]`` prefix of our own log files that follows it.
_BREAK_RE = (r"(?:\\|=)?(?:\r?\n|\\r\\n|\\n)(?:[ \t]*\[[^\]\n]{1,100}\] ?){0,2}(?:task=\S{1,200} (?:attempt=\S{1,40} )?\| ?)?"
             r"[ \t]*")
_BREAK = re.compile(_BREAK_RE)
_BREAK_LAST = frozenset("\n n\t]|")  # what a break can end with
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
    """One immutable snapshot: the automaton of anchors, what each anchor points into (``(form, offset)``
    pairs, by the anchor's index) and the forms."""

    automaton: ahocorasick_rs.AhoCorasick
    entries: tuple[tuple[tuple[int, int], ...], ...]
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
    forms = sorted({f for fs in list(_secrets.values()) for f in fs})  # a snapshot: a nested call may register
    words: dict[str, list[tuple[int, int]]] = {}
    for k, form in enumerate(forms):
        for i in _anchors(form):
            words.setdefault(form[i:i + MIN_PART], []).append((k, i))
    if not words:
        return None
    return _Matcher(ahocorasick_rs.AhoCorasick(list(words)), tuple(tuple(e) for e in words.values()), tuple(forms))


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
                _RUNS.clear()
    return _matcher


def _unescape(m: re.Match) -> str:
    g = m.lastindex
    if g == 4:
        return m.group(4)
    if g == 9:
        return ""
    code = int(m.group(g), 10 if g == 6 else 8 if g == 7 else 16)
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


def _view(text: str, pattern: re.Pattern = _ESCAPE, replace=_unescape) -> _View:
    """``text`` with each match of ``pattern`` replaced (escapes decoded; control sequences removed), with
    its map back (built only where it is needed)."""
    pieces: list[str] = []
    segments: list[tuple[int, int, int, int]] = []
    last = n = 0
    for m in pattern.finditer(text):
        s, e = m.span()
        out = replace(m)
        pieces += [text[last:s], out]
        n += s - last
        segments.append((n, len(out), s, e - s))
        n += len(out)
        last = e
    pieces.append(text[last:])
    return _View("".join(pieces), [s[0] for s in segments], segments)


# An escape view is built in chunks that end at a newline (no escape crosses one: only a quoted-printable
# soft break ends with one), so a hit maps back through its own chunk's map, never the whole text's.
_CHUNK = 8192


class _ChunkedView:
    """``_view`` of a text by chunks: the view's text at once (one ``sub`` per chunk), a chunk's map back
    only when a hit falls in it (a 1.4 MB log holds thousands of escapes, its secrets a few). ``only``:
    the chunks decoded (the others are their own view)."""

    def __init__(self, sources: list[str], patterns: list[re.Pattern], replace=_unescape,
                 only: set[int] | None = None):
        """``patterns``: each chunk's (octal and quoted-printable are decoded only in chunks that hold one)."""
        self.sources, self.patterns, self.replace = sources, patterns, replace
        self.bounds = list(itertools.accumulate((len(c) for c in sources[:-1]), initial=0))  # source offsets
        self.pieces = [patterns[k].sub(replace, c) if only is None or k in only else c for k, c in enumerate(sources)]
        self.starts = list(itertools.accumulate((len(p) for p in self.pieces[:-1]), initial=0))  # view offsets
        self.text = self.pieces[0] if len(self.pieces) == 1 else "".join(self.pieces)
        self._only = only
        self._maps: dict[int, _View] = {}

    def span(self, start: int, end: int) -> tuple[int, int]:
        """The source span of the view's ``[start, end)``, whole escapes included."""
        return self._at(start)[0], self._at(end - 1)[1]

    def _at(self, i: int) -> tuple[int, int]:
        k = bisect.bisect_right(self.starts, i) - 1
        i -= self.starts[k]
        if self._only is not None and k not in self._only:
            return self.bounds[k] + i, self.bounds[k] + i + 1
        view = self._maps.get(k)
        if view is None:
            view = self._maps[k] = _view(self.sources[k], self.patterns[k], self.replace)
        t0, t1 = view._at(i)
        return t0 + self.bounds[k], t1 + self.bounds[k]


def _chunks(text: str) -> list[str]:
    """``text`` cut after a newline about every ``_CHUNK`` characters."""
    cuts = [0]
    while cuts[-1] + _CHUNK < len(text):
        nl = text.find("\n", cuts[-1] + _CHUNK)
        if nl < 0 or nl + 1 >= len(text):
            break
        cuts.append(nl + 1)
    return [text] if len(cuts) == 1 else [text[a:b] for a, b in zip(cuts, [*cuts[1:], len(text)], strict=True)]


def _latin(text: str) -> bytes:
    """``text`` as one byte per character (other characters as ``?``): substring checks and character-class
    scans at C speed with the text's own positions. The last text's is kept (one call reads it many times)."""
    last = _LATIN
    if last[0] is text:
        return last[1]
    data = text.encode("latin-1", "replace")
    globals()["_LATIN"] = (text, data)
    return data


_LATIN: tuple[str, bytes] = ("", b"")


def _table(chars: str) -> bytes:
    """A ``bytes.translate`` table marking ``chars`` as ``a`` and every other byte as a space."""
    return bytes(97 if chr(c) in chars else 32 for c in range(256))


def _extend(text: str, a: int, b: int, form: str, i: int, j: int) -> tuple[int, int, int, int, list, list]:
    """Grow ``text[a:b] == form[i:j]`` both ways while the text agrees with the form, crossing line
    breaks (a token cut across lines, a wrapped base64 stream). Also where each crossing began, latest
    last: ``(b, j)`` before each forward crossing and ``(a, i)`` before each backward one (the text after a
    break may agree with the form by chance, such as the next hex dump line's offset ``0000…``)."""
    n = len(text)
    ends: list[tuple[int, int]] = []
    starts: list[tuple[int, int]] = []
    while j < len(form):
        if b < n and text[b] == form[j]:
            b, j = b + 1, j + 1
            continue
        m = _BREAK.match(text, b)
        if m is None or m.end() >= n or text[m.end()] != form[j]:
            break
        ends.append((b, j))
        b = m.end()
    if 0 < a < b - 1 and text[a] in "nr" and text[a - 1] == "\\":  # the hit began on an escaped newline's
        a, i = a + 1, i + 1                                          # letter: it is the break, not the form
    while i > 0:
        # A break first where the text could end one (the ``n`` of an escaped newline may also be the
        # form's next character: crossing it is right, matching it would leave the head behind).
        if a > 0 and text[a - 1] in _BREAK_LAST:
            m = _BREAK_BEFORE.search(text, max(0, a - 160), a)
            if m is not None and m.start() > 0 and text[m.start() - 1] == form[i - 1]:
                starts.append((a, i))
                a = m.start()
                continue
        if a > 0 and text[a - 1] == form[i - 1]:
            a, i = a - 1, i - 1
            continue
        break
    return a, b, i, j, starts, ends


def _hits(text: str, m: _Matcher) -> list[tuple[int, int]]:
    """Spans of ``text`` holding a whole form, or a part of one at least MIN_PART long that stands alone
    (no letter or digit right before or after it: not ten characters inside a longer word, such as the
    end of a digest that happens to end like a secret)."""
    spans: list[tuple[int, int]] = []
    done: set[tuple[int, int]] = set()  # (form, start) already extended: one extension per occurrence
    for w, start, end in m.automaton.find_matches_as_indexes(text, overlapping=True):
        length = end - start
        for k, i in m.entries[w]:
            if (k, start - i) in done:
                continue
            form = m.forms[k]
            a, b, i0, j0, starts, ends = _extend(text, start, end, form, i, i + length)
            done.add((k, start - i))
            if i0 == 0 and j0 == len(form):
                spans.append((a, b))
                continue
            # A part: it must stand alone. Where it does not only because a crossing went on into text that
            # agreed by chance (a letter or digit after it), the part up to that crossing is what stands alone.
            head = next(((x, y) for x, y in [(a, i0), *reversed(starts)] if x == 0 or not text[x - 1].isalnum()), None)
            tail = next(((x, y) for x, y in [(b, j0), *reversed(ends)] if x == len(text) or not text[x].isalnum()), None)
            if head is not None and tail is not None and tail[1] - head[1] >= MIN_PART:
                spans.append((head[0], tail[0]))
    return spans


def _clean_hits(text: str, m: _Matcher) -> list[tuple[int, int]]:
    """``_hits`` of ``text`` with control sequences removed (an escaped ``\\u001b[31m`` decodes to one)."""
    if not _has_control(text):
        return _hits(text, m)
    clean = _view(text, _CONTROL, lambda _m: "")
    return [clean.span(a, b) for a, b in _hits(clean.text, m) if b > a]


def _escaped_spans(text: str, m: _Matcher) -> list[tuple[int, int]]:
    """Every span of ``text`` that holds a secret: found in the text, in its decoded view and in the
    view of that view (doubled escapes), mapped back to the text."""
    spans = _hits(text, m)
    marks: set[bytes] = set()
    full_at: list[int] = []
    doubled_at: list[int] = []
    for x in _MARKS.finditer(_latin(text)):  # cheap checks first
        mark = x.group()
        marks.add(mark)
        if mark in _FULL_MARKS:
            full_at.append(x.start())
        if mark in _DOUBLED_MARKS:
            doubled_at.append(x.start())
    if (_ESCAPE_FULL if full_at else _ESCAPE).search(text) is None:
        return spans
    sources = _chunks(text)
    bounds = list(itertools.accumulate((len(c) for c in sources[:-1]), initial=0))
    patterns = [_ESCAPE] * len(sources)
    for p in full_at:  # octal and quoted-printable: in the chunks that hold a mark of them
        patterns[bisect.bisect_right(bounds, p) - 1] = _ESCAPE_FULL
    first = _ChunkedView(sources, patterns)
    once = first.text
    # Escapes that decode to a control character (a JSON ``\u001b``) need it removed too; a second decoding
    # only in the chunks where an escape can decode to an escape (``%25``, ``\\``), searched with the chunks
    # beside them (a form longer than a chunk is not cut there), the rest of that view being ``once``.
    hits = _clean_hits if marks & _CONTROL_MARKS else _hits
    found = hits(once, m)
    doubled = {bisect.bisect_right(first.bounds, p) - 1 for p in doubled_at}  # the chunks holding one
    found2: list[tuple[int, int]] = []
    if doubled:
        second = _ChunkedView(first.pieces, first.patterns, only=doubled)
        n = len(second.pieces)
        for lo, hi in _merged(sorted((max(k - 1, 0), min(k + 1, n - 1)) for k in doubled), touch=1):
            a = second.starts[lo]
            b = second.starts[hi + 1] if hi + 1 < n else len(second.text)
            found2 += [(x + a, y + a) for x, y in hits(second.text[a:b], m)]
    if found or found2:
        spans += [first.span(a, b) for a, b in found]
        spans += [first.span(*second.span(a, b)) for a, b in found2]
    return spans


def _merged(spans: list[tuple[int, int]], touch: int = 0) -> list[tuple[int, int]]:
    """Sorted ``(start, end)`` spans with those that overlap (or are ``touch`` apart) merged."""
    out: list[tuple[int, int]] = []
    for a, b in spans:
        if out and a <= out[-1][1] + touch:
            out[-1] = (out[-1][0], max(out[-1][1], b))
        else:
            out.append((a, b))
    return out


# -- decode before matching ------------------------------------------------------------------------------
# ANSI/VT sequences (CSI, OSC, other ESC pairs) and control characters other than tab and newline: removed
# in a view before matching, so a token split by colour codes, or UTF-16 text read as bytes (a NUL after
# every character), is found; the map back covers the removed characters too.
_CONTROL = re.compile(r"(?:\x1b\[|\x9b)[0-?]*[ -/]*[@-~]|(?:\x1b\]|\x9d)[^\x07\x1b\x9c]{0,4096}(?:\x07|\x1b\\|\x9c)?"
                      r"|\x1b[@-_]?|[\x00-\x08\x0b\x0c\x0e-\x1f\x7f\x9b\x9d]|\r(?!\n)")
_CONTROL_CHARS = "".join(map(chr, [*range(0, 9), 0x0b, 0x0c, *range(0x0e, 0x20), 0x7f, 0x9b, 0x9d]))
_CONTROL_TABLE = _table(_CONTROL_CHARS)


def _has_control(text: str) -> bool:
    """A control character ``_CONTROL`` removes (all are in Latin-1: ``_latin`` keeps them): a fast first look."""
    return _latin(text).translate(_CONTROL_TABLE).find(b"a") >= 0


# Candidate runs of an encoding, decoded and searched again: base64 (standard or URL-safe; base32 and
# unseparated hex are such runs too), and hex in groups separated by a space, ``:`` or ``-`` (``xxd``,
# ``od -x``, ``hexdump -C``). Each is found by one character class first (a fast scan), then split.
_B64_RUN = re.compile(r"[A-Za-z0-9+/_-]{16,}={0,6}")
_B32_ONLY = re.compile(r"[A-Z2-7]{16,}=*")
_HEX_ONLY = re.compile(r"(?:[0-9A-Fa-f]{2}-?){8,}")
_HEX_FIRST = frozenset("\\=\r\n \t")  # what may follow a dump line's last group when its next line goes on
_HEX_CLASS, _HEX_NEED = _table("0123456789ABCDEFabcdef :-"), b"a" * 23  # _hex_areas: [0-9A-Fa-f :-]{23,}
_HEX_RUN = re.compile(r"(?<![0-9A-Fa-f])[0-9A-Fa-f]{2}(?:[ :-]?[0-9A-Fa-f]{2}){7,}")
# What may separate two pieces of one encoded stream: a line break with its prefix (a wrapped stream; the
# line's rest for a hex dump: its ASCII column, then the next line's offset) or hexdump -C's middle gap.
_B64_GAP = re.compile(_BREAK_RE)
# The same runs, each with the line break that follows it if any (a stream that may go on on the next
# line: only then are runs looked up by position and joined).
_B64_RUN_END = re.compile(r"([A-Za-z0-9+/_-]{16,}={0,6})((?:\\|=)?(?:\r?\n|\\r\\n|\\n))?")
_B64_AFTER = frozenset(b"=\\\r\n")  # what may follow a run inside a _B64_RUN_END match
_B64_CLASS, _B64_NEED = _table(string.ascii_letters + string.digits + "+/_-"), b"a" * 16  # its first part
_LINE_END = re.compile(r"\r?\n|\\r\\n|\\n")
_HEX_GAP = re.compile(f"  |(?:[ \\t]{{2,}}[^\\n]{{0,100}})?(?:{_BREAK_RE})(?:[0-9A-Fa-f]{{4,16}}:?[ \\t]+)?")
DEPTH = 3  # layers decoded (base64 of gzip of base64 of a config.json holding base64 is 3)
MAX_INFLATE = 8 << 20  # a gzip stream is inflated up to this many bytes
MIN_DECODED = 8  # fewer decoded bytes are not searched (they cannot hold a secret's MIN_PART)
_PRINTABLE = bytes([0, 9, 10, 13, *range(32, 127)])


def _plausible(data: bytes) -> bool:
    """Text-like bytes (ASCII, or UTF-16 of ASCII: NULs between): at most a fifth other bytes."""
    return len(data) >= MIN_DECODED and len(data.translate(None, _PRINTABLE)) * 5 <= len(data)


def _runs(text: str, pattern: re.Pattern, gap: re.Pattern, areas: Iterable[tuple[int, int]] | None = None,
          first: frozenset = frozenset("\\=\r\n"), lo: int = 0, hi: int | None = None,
          joins=None) -> list[list[tuple[int, int]]]:
    """Runs of ``pattern`` in ``text[lo:hi]`` (inside ``areas``, when given), consecutive ones joined when
    only ``gap`` separates them (a wrapped stream, a dump's lines) and ``joins(previous, gap)`` agrees."""
    out: list[list[tuple[int, int]]] = []
    found = ((r.span() for r in pattern.finditer(text, lo, len(text) if hi is None else hi)) if areas is None else
             (r.span() for a, b in areas for r in pattern.finditer(text, a, b)))
    for a, b in found:
        if out and text[out[-1][-1][1]:out[-1][-1][1] + 1] in first and (g := gap.fullmatch(text, out[-1][-1][1], a)) \
                and (joins is None or joins(text, out[-1][-1], g)):
            out[-1].append((a, b))
        else:
            out.append([(a, b)])
    return out


class _Budget:
    """Bytes that may still be decoded for one ``redact`` call (a huge blob is not decoded forever), and
    what each candidate run decoded to (a log repeats its prefixes: each is decoded once)."""

    def __init__(self, n: int):
        self.left = n
        self.seen: dict[tuple, list[tuple[int, int]]] = {}


# What short base64 runs decoded to, by (matcher, depth, run): the matcher is replaced whole when a secret is
# registered (and the cache emptied), so a new secret is never missed by an old entry.
_RUNS: dict[tuple, list[tuple[int, int]]] = {}


def _bytes_spans(data: bytes, m: _Matcher, depth: int, budget: _Budget) -> tuple[bool, list[tuple[int, int]]]:
    """(does ``data`` look like text or hold a gzip stream, the byte spans holding a secret)."""
    spans: list[tuple[int, int]] = []
    found = False
    budget.left -= len(data)
    z = data.find(b"\x1f\x8b\x08")
    if z >= 0 and budget.left > 0:
        try:
            inner = zlib.decompressobj(31).decompress(data[z:], MAX_INFLATE)
        except zlib.error:
            inner = b""
        if inner:
            found = True
            if _bytes_spans(inner, m, depth, budget)[1]:
                spans.append((z, len(data)))  # a compressed secret: the whole stream from its header
    if _plausible(data):
        found = True
        spans += _spans(data.decode("latin-1"), m, depth, budget, nested=True)
    return found, spans


def _b64_spans(chars: str, m: _Matcher, depth: int, budget: _Budget) -> list[tuple[int, int]]:
    """Spans of ``chars`` (one base64 run) whose decoding, at whichever alignment reads as text, holds a
    secret; a run of base32's or hex's alphabet is decoded as that too."""
    out: list[tuple[int, int]] = []
    core = chars.rstrip("=")
    norm = core.replace("-", "+").replace("_", "/")
    for k in range(4):  # the stream's alignment: the run may start anywhere in it
        s = norm[k:len(norm) - (len(norm) - k) % 4]
        if len(s) < 16:
            break
        try:
            data = base64.b64decode(s, validate=True)
        except ValueError:
            continue
        ok, found = _bytes_spans(data, m, depth - 1, budget)
        out += [(k + x * 4 // 3, min(k + -(-y * 4 // 3), len(core))) for x, y in found]
        if ok:
            break
    if _B32_ONLY.fullmatch(chars):
        for k in range(8):
            s = core[k:len(core) - (len(core) - k) % 8]
            if len(s) < 16:
                break
            try:
                data = base64.b32decode(s)
            except ValueError:
                continue
            ok, found = _bytes_spans(data, m, depth - 1, budget)
            out += [(k + x * 8 // 5, min(k + -(-y * 8 // 5), len(core))) for x, y in found]
            if ok:
                break
    if _HEX_ONLY.fullmatch(chars):
        out += _hex_spans(chars, [(0, len(chars))], m, depth, budget)
    return out


def _b64_run_ends(text: str, data: bytes) -> list[tuple[str, str, int]]:
    """``_B64_RUN_END.findall(text)`` with each match's start: each candidate's start found by a byte scan
    (``data``: ``_latin``), where the regex alone tries every character of every word."""
    marked = data.translate(_B64_CLASS)
    out = []
    n = len(marked)
    p = marked.find(_B64_NEED)
    while p >= 0:  # the leftmost place 16 run characters start is where the regex's next match starts
        e = marked.find(b" ", p + 16)
        e = n if e < 0 else e
        if e < n and data[e] in _B64_AFTER:  # padding or a line break: the regex says how much it takes
            r = _B64_RUN_END.match(text, p)
            out.append((*r.groups(""), p))
            e = r.end()
        else:
            out.append((text[p:e], "", p))
        p = marked.find(_B64_NEED, e)
    return out


def _hex_areas(data: bytes) -> list[tuple[int, int]]:
    """The matches of ``[0-9A-Fa-f :-]{23,}`` (where a hex run can be), by a byte scan of ``data``."""
    marked = data.translate(_HEX_CLASS)
    out = []
    p = marked.find(_HEX_NEED)
    while p >= 0:
        e = marked.find(b" ", p)
        e = len(marked) if e < 0 else e
        out.append((p, e))
        p = marked.find(_HEX_NEED, e)
    return out


def _regions(text: str, starts: list[int]) -> list[tuple[int, int]]:
    """The lines of ``text`` holding the runs that start at ``starts`` (ascending), each with the line after
    it (a run there that goes on adds the next), overlapping ones merged: ``(start, end)``, each starting a
    line (a run never crosses a newline, so a scan from there finds the runs a scan of the whole text
    finds). Each line is scanned once, however many runs it holds (one long line: a JSON document)."""
    spans: list[tuple[int, int]] = []
    n, line_end = len(text), -1
    for p in starts:
        if p < line_end:  # on the line of the previous one: the same region
            continue
        line_end = text.find("\n", p)
        line_end = n if line_end < 0 else line_end
        after = text.find("\n", line_end + 1) if line_end < n else -1
        end = n if after < 0 else after
        if spans and p <= spans[-1][1]:
            spans[-1] = (spans[-1][0], max(spans[-1][1], end))
        else:
            spans.append((text.rfind("\n", 0, p) + 1, end))
    return spans


def _decoded_spans(text: str, m: _Matcher, depth: int, budget: _Budget) -> list[tuple[int, int]]:
    """Spans of ``text`` whose base64, base32 or hex decodes to something holding a secret."""
    out: list[tuple[int, int]] = []

    def decoded(chars: str) -> list[tuple[int, int]]:
        key = (id(m.automaton), depth, chars)
        found = budget.seen.get(key)
        if found is None:
            found = _RUNS.get(key)
            if found is None:
                found = budget.seen[key] = _b64_spans(chars, m, depth, budget)
                if len(chars) <= 256:  # a log's repeated prefixes and paths: decoded once per process
                    if len(_RUNS) >= 4096:
                        _RUNS.clear()
                    _RUNS[key] = found
        return found

    # Each distinct run decoded first (a log repeats its prefixes and paths); positions are looked up only
    # when one holds a secret or a run is wrapped onto the next line (its pieces decode only together).
    # Only the lines that hold such a run are read by position, with the line after (a wrapped stream's next
    # piece; a longer stream's next line ends in a break too, so its region joins this one).
    data = _latin(text)
    runs = _b64_run_ends(text, data)  # one pass: each run, whether a line break follows it, where
    hot = {c for c in {run for run, _, _ in runs} if budget.left > 0 and decoded(c)}
    regions = _regions(text, [p for run, brk, p in runs if brk or run in hot])
    for pieces in (p for lo, hi in regions for p in _runs(text, _B64_RUN, _B64_GAP, lo=lo, hi=hi)):
        if budget.left <= 0:
            return out
        chars = text[pieces[0][0]:pieces[0][1]] if len(pieces) == 1 else "".join(text[a:b] for a, b in pieces)
        found = decoded(chars)
        if found:
            starts, n = [], 0  # a run's character -> its position in the text
            for a, b in pieces:
                starts.append(n)
                n += b - a

            def at(c: int, pieces=pieces, starts=starts) -> int:
                k = bisect.bisect_right(starts, c) - 1
                return pieces[k][0] + c - starts[k]

            out += [(at(x), at(y - 1) + 1) for x, y in found if y > x]
    areas = _hex_areas(data)
    for pieces in _runs(text, _HEX_RUN, _HEX_GAP, areas, _HEX_FIRST, joins=_hex_joins) if areas else ():
        if budget.left <= 0:
            return out
        out += _hex_spans(text, pieces, m, depth, budget)
    return out


def _hex_joins(text: str, previous: tuple[int, int], gap: re.Match) -> bool:
    """Whether a dump line's run goes on after ``gap``: across a line break, yes; across the two spaces of
    hexdump -C's middle gap only after its first half (8 bytes). Two spaces after a longer run (``xxd -g1``'s
    16 bytes) lead to the ASCII column, which is a hex run only by chance (a token of hex digits): joined, it
    would be decoded as bytes and hide where the column is (issue: github.token's xxd -g1 column leaked)."""
    return gap.group() != "  " or sum(c in string.hexdigits for c in text[previous[0]:previous[1]]) == 16


_ASCII_COLUMN = re.compile(r"[ \t]{2,}\|?")  # xxd and hexdump -C: two spaces (and a bar) before it


def _ascii_column_end(text: str, where: list[int], b: int) -> int:
    """The end of the ASCII column of the dump line ``b`` is on (as many characters as that line has
    bytes, after the spaces and ``|`` that follow its hex), or ``b`` when there is none."""
    starts = [m.end() for m in _LINE_END.finditer(text, max(0, b - 400), b)]
    line_start = starts[-1] if starts else 0
    on_line = [p for p in where if line_start <= p < b + 200 and not _LINE_END.search(text, line_start, p)]
    if not on_line:
        return b
    col = _ASCII_COLUMN.match(text, max(on_line) + 2)
    if col is None:
        return b
    end = min(col.end() + len(on_line), len(text))
    line_end = _LINE_END.search(text, col.end(), end)
    return max(b, line_end.start() if line_end else end)


def _hex_spans(text: str, pieces: list[tuple[int, int]], m: _Matcher, depth: int,
               budget: _Budget) -> list[tuple[int, int]]:
    """A hex stream (one run, or a dump's lines) decoded in both byte orders of its groups."""
    groups: list[tuple[int, str]] = []  # (position of the group's first digit, its digits)
    for a, b in pieces:
        for g in re.finditer(r"[0-9A-Fa-f]+", text[a:b]):
            if len(g.group()) % 2 == 0:
                groups.append((a + g.start(), g.group()))
    if sum(len(g) for _, g in groups) < 2 * MIN_DECODED:
        return []
    where = [p + i for p, g in groups for i in range(0, len(g), 2)]  # byte j -> its two digits
    orders = [list(range(len(where)))]
    sizes = [len(g) for _, g in groups]
    size = max(set(sizes), key=sizes.count)
    if size >= 4:  # little-endian words (od -x, xxd -e): each group's bytes reversed
        le, j = [], 0
        for _, g in groups:
            n = len(g) // 2
            le += list(range(j + n - 1, j - 1, -1)) if len(g) == size else list(range(j, j + n))
            j += n
        orders.append(le)
    raw = bytes.fromhex("".join(g for _, g in groups))
    out: list[tuple[int, int]] = []
    for order in orders:
        data = raw if order is orders[0] else bytes(raw[i] for i in order)
        _, found = _bytes_spans(data, m, depth - 1, budget)
        for x, y in found:
            a = min(where[order[i]] for i in range(x, y))
            b = max(where[order[i]] for i in range(x, y)) + 2
            if _LINE_END.search(text, a, b):  # a dump's lines: the last one's ASCII column shows the bytes too
                b = _ascii_column_end(text, where, b)
            out.append((a, b))
    return out


def _shape_spans(text: str) -> list[tuple[int, int]]:
    """Credential shapes in a decoded layer (its text cannot be rewritten, only its encoding redacted)."""
    spans = [t.span() for t in _TOKEN_SHAPES.finditer(text)]
    spans += [(a.end(2), a.end()) for a in _AUTH_HEADER.finditer(text)]
    spans += [(a.end(1), a.start(2)) for a in _DOCKER_AUTH.finditer(text)]
    return spans


def _spans(text: str, m: _Matcher, depth: int, budget: _Budget, nested: bool = False) -> list[tuple[int, int]]:
    """Every span of ``text`` holding a secret: control sequences removed first, then the literal forms
    and escapes (``_escaped_spans``), then, ``depth`` layers deep, what its encoded runs decode to."""
    if _has_control(text) or ("\r" in text and _CONTROL.search(text)):
        clean = _view(text, _CONTROL, lambda _m: "")
        if clean.text != text:  # every pass removes something, so this ends (a lone C1 \x9b once looped forever)
            return [clean.span(a, b) for a, b in _spans(clean.text, m, depth, budget, nested) if b > a]
    spans = _escaped_spans(text, m)
    if nested:
        spans += _shape_spans(text)
    if depth > 0:
        spans += _decoded_spans(text, m, depth, budget)
    return spans


def _secret_spans(text: str, m: _Matcher) -> list[tuple[int, int]]:
    return _spans(text, m, DEPTH, _Budget(max(4 * len(text), 1 << 20)))


def _escape_at(text: str, p: int) -> int:
    """The length of the backslash escape starting at ``p`` (0 if none: an escaped backslash before it)."""
    if text[p] != "\\" or p + 1 >= len(text):
        return 0
    k = p
    while k > 0 and text[k - 1] == "\\":
        k -= 1
    if (p - k) % 2:
        return 0
    return {"u": 6, "x": 4}.get(text[p + 1], 2)


def _snap(text: str, a: int, b: int) -> tuple[int, int]:
    """``[a, b)`` widened to whole backslash escapes, so a redacted JSON string stays valid."""
    for p in range(max(0, a - 5), a):
        if p + _escape_at(text, p) > a:
            a = p
            break
    for p in range(max(0, b - 5), b):
        n = _escape_at(text, p)
        if p + n > b:
            b = p + n
            break
    return a, min(b, len(text))


def _text_spans(text: str) -> list[tuple[int, int]]:
    """The spans of ``text`` that ``redact`` replaces with ``REDACTED`` (before the shape patterns)."""
    m = _current()
    if m is None:
        return []
    spans = _secret_spans(text, m)
    if spans and "\\" in text:
        spans = [_snap(text, a, b) for a, b in spans]
    return spans


def _replaced(text: str, spans: list[tuple[int, int]]) -> str:
    out, pos = [], 0
    for a, b in sorted(spans):
        if b <= pos:
            continue
        if a >= pos:
            out += [text[pos:a], REDACTED]
        pos = b
    out.append(text[pos:])
    return "".join(out)


def redact(text: str) -> str:
    if not text:
        return text
    spans = _text_spans(text)
    if spans:
        text = _replaced(text, spans)
    return _shapes_redacted(text)


def redact_lines(lines: list[str]) -> list[str]:
    """Each of ``lines`` redacted as a part of the text they make together, each kept in its place: a log
    kept line by line (activities/log_reads.py) where a token wrapped or hex-dumped across lines is found
    only whole (redacted line by line, a wrapped token's 7-9 character head on the first line is kept)."""
    text = "\n".join(lines)
    spans = _text_spans(text) if text else []
    out, start = [], 0
    for line in lines:
        end = start + len(line)
        mine = [(max(a, start) - start, min(b, end) - start) for a, b in spans if a < end and b > start]
        out.append(_shapes_redacted(_replaced(line, mine) if mine else line) if line else line)
        start = end + 1
    return out


def _shapes_redacted(text: str) -> str:
    """``text`` with the credential shapes (token prefixes, secret assignments, auth headers) redacted."""
    data = _latin(text)
    if _holds(data, _TOKEN_PREFIXES_B, _TOKEN_PREFIX):
        text = _TOKEN_SHAPES.sub(REDACTED, text)
        data = _latin(text)
    # The case-insensitive patterns run only where their words are (each alone reads a log at a few MB/s):
    # ASCII-lowered bytes hold every match, unless the text has one of the four characters ``re`` matches to
    # an ASCII letter ignoring case (then all run). A redaction never makes one of these words.
    lowered = b"" if not text.isascii() and _FOLDS.search(text) else data.lower()
    if b"=" in data and (not lowered or _holds(lowered, _SECRET_WORDS, _SECRET_WORD)):
        text = _SECRET_ASSIGNMENT.sub(lambda m: f"{m.group(1)}={REDACTED}", text)
    if not lowered or b'"auth"' in lowered:
        text = _DOCKER_AUTH.sub(lambda m: f"{m.group(1)}{REDACTED}{m.group(2)}", text)
    if not lowered or b"authorization" in lowered:
        text = _AUTH_HEADER.sub(lambda m: f"{m.group(1)}{m.group(2)} {REDACTED}", text)
    return text


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
