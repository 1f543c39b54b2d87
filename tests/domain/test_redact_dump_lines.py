"""A hex dump of a token whose characters are hex digits (the GitHub stand-in's ``ghs_standin_`` + 32 hex)
is redacted whatever its digits (tests/e2e/test_sentinel_encodings_e2e.py failed for ~1 token in 25).

Two holes, both in how ``domain.redact`` reads a dump's last full line of the token: its ASCII column (16
hex digits) was extended across the line break into the next line's offset when the token's next character
was that offset's ``0``, so the part no longer stood alone and was kept; and after ``xxd -g1``'s 16 bytes
the two spaces before the column were taken for hexdump -C's middle gap, so the column was decoded as more
bytes of the stream and the span's end no longer reached it. The forms and needles are tests/sentinel_forms.py's.
"""

from __future__ import annotations

import pytest

from domain.redact import redact, register_secret
from tests.sentinel_forms import forms, needles

DUMPS = ("xxd", "xxd_g1", "xxd_e", "od_x", "hexdump_c")
SEEN = "ghs_standin_423a3a60fd867027e870ff543cbd80c3"  # the token of the failing e2e run (its digits, not a secret)
HEX = "0123456789abcdef"


@pytest.fixture(autouse=True)
def _registry(monkeypatch):
    import domain.redact as r

    monkeypatch.setattr(r, "_secrets", {})
    monkeypatch.setattr(r, "_matcher", None)
    monkeypatch.setattr(r, "_stale", False)


def _tokens() -> list[str]:
    """The failing token, and hex-bodied tokens where each digit comes at each position once (so each dump
    line's last character is followed by every digit, the offsets' ``0`` included), and a '0' after each
    16-character piece of a mixed-alphabet token."""
    out = [SEEN]
    out += ["ghs_standin_" + (HEX * 3)[r:r + 32] for r in range(16)]
    out += ["wh-s3ntinel+Web/hook=Secret-" + (HEX * 2)[r:r + 16] for r in range(16)]
    mixed = "Zq7Kx2Lp9Rv4Tn8Wm3Yb6Hd1Gf5Jc0Se"
    out += [mixed[:k] + "0" + mixed[k + 1:] for k in range(len(mixed))]
    return out


def _log(label: str, name: str, text: str) -> str:
    """The form as our evidence log holds it: one ``[task stream]`` line per printed line."""
    return "".join(f"[/job/0 stderr] {line}\n" for line in f"form {label} {name} {text}".split("\n"))


@pytest.mark.parametrize("token", _tokens())
def test_every_dump_of_a_token_is_redacted_whatever_its_characters(token):
    register_secret(token)
    for name in DUMPS:
        out = redact(_log("github.token", name, forms(token)[name]))
        left = [n for n in needles(token)[name] if n in out]
        assert not left, (name, out)


def test_the_seen_token_leaked_before():
    """The needle that was left: the ASCII column of the dump's third line, 16 hex digits of the token."""
    register_secret(SEEN)
    assert "027e870ff543cbd8" in needles(SEEN)["xxd_g1"]
    out = redact(_log("github.token", "xxd_g1", forms(SEEN)["xxd_g1"]))
    assert "027e870ff543cbd8" not in out and "[REDACTED]" in out
