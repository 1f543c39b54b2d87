"""A log kept line by line (activities/log_reads.py, what check_build_log's evidence .log is made of) holds
no part of a credential printed across lines, however its reads split it (a retry reads only new lines).

Before, each new line was redacted alone: a wrapped ``iris job logs`` token's 7-9 character head on its
first line, and a hex dump's first line, were kept (one line cannot say what follows). Forms and needles:
tests/sentinel_forms.py."""

from __future__ import annotations

import asyncio

import pytest

from activities.log_reads import LogReads
from clients.iris import CompleteLog, LogEntry
from domain.redact import REDACTED, redact_lines, register_secret
from tests.sentinel_forms import forms, head_needles, needles

TOKEN = "ghs_standin_" + "0123456789abcdef" * 2
SECRET = "wh-s3ntinel+Web/hook=Secret-0f9a8b7c6d5e4f3a"
MULTI = [n for n in sorted(forms("x" * 40)) if "\n" in forms(TOKEN)[n]]


@pytest.fixture(autouse=True)
def _registry(monkeypatch):
    import domain.redact as r

    monkeypatch.setattr(r, "_secrets", {})
    monkeypatch.setattr(r, "_matcher", None)
    monkeypatch.setattr(r, "_stale", False)
    register_secret(TOKEN)
    register_secret(SECRET)


def _lines(value: str, name: str) -> list[str]:
    return ["step 4: pushing", *f"form {name} {forms(value)[name]}".split("\n"), "step 5: done"]


def _left(text: str, value: str, name: str) -> list[str]:
    return [n for n in [*needles(value)[name], *head_needles(value).get(name, [])] if n in text]


def test_lines_are_redacted_together_and_kept_in_place():
    for value in (TOKEN, SECRET):
        for name in MULTI:
            lines = _lines(value, name)
            out = redact_lines(lines)
            assert len(out) == len(lines) and out[0] == lines[0] and out[-1] == lines[-1]
            assert not _left("\n".join(out), value, name), (name, out)
            assert REDACTED in "\n".join(out)


def test_a_wrapped_head_is_kept_by_line_by_line_redaction():
    """Why lines go together: the wrapped token's head is a needle a line alone cannot redact."""
    from domain.redact import redact

    lines = _lines(TOKEN, "iris_wrap80")
    assert _left("\n".join(redact(x) for x in lines), TOKEN, "iris_wrap80")


@pytest.mark.parametrize("value", [TOKEN, SECRET])
def test_saved_log_holds_no_needle_at_any_split_of_its_reads(tmp_path, value):
    for name in MULTI:
        lines = _lines(value, name)
        for cut in range(1, len(lines)):
            reads = LogReads(tmp_path / f"{name}-{cut}")
            entries = [LogEntry(ts_ms=i, key="/job/0", source="stderr", data=x, seq=i + 1) for i, x in enumerate(lines)]

            def reader(upto, entries=entries):
                async def read(start):
                    got = entries[:upto]
                    return CompleteLog(entries=[*(start.entries if start else []), *got[len(start.entries) if start else 0:]],
                                       cursor=upto, complete=upto == len(entries), reads=1)
                return read

            asyncio.run(reads.read("job", reader(cut)))  # an attempt that saw part of the log
            saved = asyncio.run(reads.read("job", reader(len(lines))))  # the retry: only new lines read
            text = "\n".join(e.data for e in saved.log.entries)
            assert len(saved.log.entries) == len(lines)
            assert not _left(text, value, name), (name, cut, text)
