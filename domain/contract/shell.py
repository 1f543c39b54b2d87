"""A tiny reader for the shell the build contract is written in (the script and Dockerfile RUN steps).

Why not a full shell parser: the contract files use a handful of shapes (`: "${VAR:?}"`, `if [ "$X" = v ]`,
`case`, `for`, `echo "..."`). This walker follows those shapes and tracks which `if` branch each
command sits in, so a parser can say e.g. "required only when WHEEL_SOURCE=prebuilt-wheelhouse".
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass, field

from domain.contract.models import Condition, Guard

_HEREDOC = re.compile(r"<<-?\s*['\"]?([A-Za-z_][A-Za-z0-9_]*)['\"]?")
_TEST = re.compile(
    r"""^\[\[?\s*"?\$\{?([A-Za-z_][A-Za-z0-9_]*)\}?"?\s*(==|=|!=)\s*"?([^"\s\]]*)"?\s*\]\]?$"""
)
CASE_END = "\x00;;"


def logical_lines(text: str) -> list[tuple[int, str]]:
    """(first line number, text) with `\\` continuations joined, heredoc bodies and comment lines dropped."""
    out: list[tuple[int, str]] = []
    lines = text.splitlines()
    i = 0
    while i < len(lines):
        start = i + 1
        line = lines[i]
        while line.rstrip().endswith("\\") and i + 1 < len(lines):
            i += 1
            line = line.rstrip()[:-1] + " " + lines[i].strip()
        i += 1
        stripped = line.strip()
        if not stripped or stripped.startswith("#"):
            continue
        out.append((start, stripped))
        m = _HEREDOC.search(stripped)
        if m and not stripped.startswith("echo"):
            end = m.group(1)
            while i < len(lines) and lines[i].strip() != end:
                i += 1
            i += 1
    return out


def split_segments(text: str) -> list[str]:
    """Split a command line on top-level `;`, `&&`, `||` and newlines (quotes and `$(...)` respected).

    `;;` (end of a case arm) is kept as its own segment ``CASE_END``.
    """
    segs: list[str] = []
    buf: list[str] = []
    quote: str | None = None
    depth = 0
    i = 0
    n = len(text)
    in_test = False  # inside `if TEST;` / `elif TEST;`: keep `&&` / `||` in the test

    def flush() -> None:
        nonlocal in_test
        s = "".join(buf).strip()
        if s:
            segs.append(s)
        buf.clear()
        in_test = False

    while i < n:
        c = text[i]
        if not quote and not "".join(buf).strip() and re.match(r"(if|elif|while|until)\s", text[i:]):
            in_test = True
        if quote:
            buf.append(c)
            if c == "\\" and quote == '"' and i + 1 < n:
                buf.append(text[i + 1])
                i += 2
                continue
            if c == quote:
                quote = None
            i += 1
            continue
        if c in "'\"":
            quote = c
            buf.append(c)
        elif c == "\\" and i + 1 < n:
            buf.append(c + text[i + 1])
            i += 2
            continue
        elif text.startswith("$(", i):
            depth += 1
            buf.append("$(")
            i += 2
            continue
        elif c == ")" and depth:
            depth -= 1
            buf.append(c)
        elif depth == 0 and text.startswith(";;", i):
            flush()
            segs.append(CASE_END)
            i += 2
            continue
        elif depth == 0 and (c == ";" or c == "\n"):
            flush()
        elif depth == 0 and not in_test and (text.startswith("&&", i) or text.startswith("||", i)):
            flush()
            i += 2
            continue
        else:
            buf.append(c)
        i += 1
    flush()
    return segs


def parse_test(text: str) -> Guard:
    """`[ "$X" = v ] && [ "$Y" != w ]` → Guard; anything else → an opaque Guard."""
    text = text.strip()
    conds: list[Condition] = []
    for part in re.split(r"\s*&&\s*", text):
        m = _TEST.match(part.strip())
        if not m:
            return Guard(opaque=text)
        op = "=" if m.group(2) in ("=", "==") else "!="
        conds.append(Condition(var=m.group(1), op=op, value=m.group(3)))
    return Guard(all_of=conds)


@dataclass
class Command:
    """One simple command with the branch it runs in."""

    text: str
    line: int
    guards: list[Guard]
    in_loop: bool  # inside for/while or a redirected `{ ... }` group: not a plain log line
    loop_header: str | None = None
    case_var: str | None = None
    case_pattern: str | None = None


@dataclass
class _Frame:
    kind: str  # "if" | "loop" | "group" | "case"
    guard: Guard | None = None
    header: str | None = None
    case_var: str | None = None
    pattern: str | None = None
    prior: list[Guard] = field(default_factory=list)  # earlier if/elif tests, for else


def walk(lines: list[tuple[int, str]]) -> Iterator[Command]:
    """Yield every simple command of ``lines`` with its guards (if/elif/else/case) and loop context."""
    stack: list[_Frame] = []

    def guards() -> list[Guard]:
        out: list[Guard] = []
        for f in stack:
            if f.kind == "if":
                out.extend(Guard(all_of=g.all_of, negated=True, opaque=g.opaque) for g in f.prior)
                if f.guard is not None:
                    out.append(f.guard)
            elif f.kind == "case" and f.pattern is not None:
                if re.fullmatch(r"[A-Za-z0-9_.\-/]+", f.pattern):
                    out.append(Guard(all_of=[Condition(var=f.case_var or "", op="=", value=f.pattern)]))
                else:
                    out.append(Guard(opaque=f"{f.case_var} matches {f.pattern}"))
        return out

    def in_loop() -> bool:
        return any(f.kind in ("loop", "group") for f in stack)

    def loop_header() -> str | None:
        for f in reversed(stack):
            if f.kind == "loop":
                return f.header
        return None

    for lineno, text in lines:
        for seg in split_segments(text):
            seg = seg.strip()
            if seg == CASE_END:
                if stack and stack[-1].kind == "case":
                    stack[-1].pattern = None
                continue
            # leading keywords that only continue a compound command
            while True:
                m = re.match(r"^(then|do|else)\b\s*(.*)$", seg, re.S)
                if not m:
                    break
                if m.group(1) == "else" and stack and stack[-1].kind == "if":
                    f = stack[-1]
                    if f.guard is not None:
                        f.prior.append(f.guard)
                    f.guard = None
                seg = m.group(2).strip()
            if not seg:
                continue
            m = re.match(r"^(if|elif)\s+(!\s+)?(.*)$", seg, re.S)
            if m:
                test = m.group(3)
                g = parse_test(test) if not m.group(2) else Guard(opaque="! " + test)
                if m.group(1) == "if":
                    stack.append(_Frame(kind="if", guard=g))
                elif stack and stack[-1].kind == "if":
                    f = stack[-1]
                    if f.guard is not None:
                        f.prior.append(f.guard)
                    f.guard = g
                continue
            if seg == "fi" or seg.startswith("fi "):
                if stack and stack[-1].kind == "if":
                    stack.pop()
                continue
            m = re.match(r"^(for|while|until)\b(.*)$", seg, re.S)
            if m:
                stack.append(_Frame(kind="loop", header=seg))
                continue
            if seg == "done" or seg.startswith("done "):
                if stack and stack[-1].kind == "loop":
                    stack.pop()
                continue
            m = re.match(r"""^case\s+"?\$\{?([A-Za-z_][A-Za-z0-9_]*)\}?"?\s+in\b\s*(.*)$""", seg, re.S)
            m2 = m or re.match(r"^case\s+.*?\s+in\b\s*(.*)$", seg, re.S)
            if m2:
                stack.append(_Frame(kind="case", case_var=m.group(1) if m else None))
                seg = (m.group(2) if m else m2.group(1)).strip()
                if not seg:
                    continue
            if seg == "esac":
                if stack and stack[-1].kind == "case":
                    stack.pop()
                continue
            if stack and stack[-1].kind == "case":
                am = re.match(r"^\(?([^()\s]+)\)\s*(.*)$", seg, re.S)
                if am and not seg.startswith("$("):
                    stack[-1].pattern = am.group(1)
                    seg = am.group(2).strip()
                    if not seg:
                        continue
            if seg in ("{", "("):
                stack.append(_Frame(kind="group" if seg == "{" else "subshell"))
                continue
            if seg.startswith("}") or seg == ")":
                if stack and stack[-1].kind in ("group", "subshell"):
                    stack.pop()
                continue
            top_case = next((f for f in reversed(stack) if f.kind == "case"), None)
            yield Command(
                text=seg,
                line=lineno,
                guards=guards(),
                in_loop=in_loop(),
                loop_header=loop_header(),
                case_var=top_case.case_var if top_case else None,
                case_pattern=top_case.pattern if top_case else None,
            )


def echo_text(command: str) -> str | None:
    """The argument text of a stdout `echo` (None for non-echo or redirected echo)."""
    m = re.match(r"^echo\s+(.*)$", command, re.S)
    if not m:
        return None
    rest = m.group(1).strip()
    if rest.startswith("-"):
        return None
    if rest.startswith('"'):
        end = _closing_quote(rest, '"')
        body, tail = rest[1:end], rest[end + 1 :]
        body = re.sub(r'\\([\\"`$])', r"\1", body)
    elif rest.startswith("'"):
        end = rest.index("'", 1)
        body, tail = rest[1:end], rest[end + 1 :]
    else:
        parts = re.split(r"\s+(?=[0-9]?>)", rest, maxsplit=1)
        body, tail = parts[0], (parts[1] if len(parts) > 1 else "")
    if ">" in tail or "|" in tail:
        return None
    return body


def _closing_quote(s: str, q: str) -> int:
    i = 1
    while i < len(s):
        if s[i] == "\\":
            i += 2
            continue
        if s[i] == q:
            return i
        i += 1
    return len(s) - 1
