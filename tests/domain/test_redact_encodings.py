"""Every encoding of every kind of credential is redacted (issue #27 item 1): hex in either case and with
separators, percent-encoding in either case, of every byte and doubled, JSON escapes (``\\/``, ``\\u002b``,
``\\u00XX`` of every character), a token cut by a line break (bare, indented, a ``\\`` continuation), base64
at every alignment, wrapped, JSON- and percent-escaped. Each form is checked as printed, inside a JSON
document (what history and diagnostics files hold) and line by line (what a per-line sink holds). The forms
and needles come from tests/sentinel_forms.py, which knows nothing of domain.redact."""

from __future__ import annotations

import base64
import json

import pytest

from domain.redact import REDACTED, redact, redact_obj, register_secret
from tests.sentinel_forms import forms, head_needles, needles

# Five credentials of the shapes the service holds (sentinels, never real).
CREDENTIALS = {
    "registry.token": "s3nt1nel+Reg/is~??>?>try=Tok3n-ABCDEFGH~xyz",
    "github.token": "ghp_" + "S3ntinelGitHubT0kenAbCdEfGhIjKlMn0pQ",  # a sentinel, split so no scanner takes it for a token
    "github.webhook.secret": "5e471e1-webhook-secret-0f9a8b7c6d5e4f3a2b1c",
    "temporal.api_key": "eyJhbGciOiJFUzI1NiJ9.eyJzdWIiOiJzZW50aW5lbCJ9.S3nt+nel/Sig_naturE-0123456789",
    "clusters.iris.token": "iris_s3ntinel?token&with=url/chars+7",
}
FORM_NAMES = sorted(forms("x" * 16))


@pytest.fixture(autouse=True)
def _registered(monkeypatch):
    """Exactly these five registered (other tests register short sentinels such as ``abcd``)."""
    import domain.redact as r

    monkeypatch.setattr(r, "_secrets", {})
    monkeypatch.setattr(r, "_matcher", None)
    monkeypatch.setattr(r, "_stale", False)
    for value in CREDENTIALS.values():
        register_secret(value)


def _left(text: str, value: str, name: str, joined: bool = True) -> list[str]:
    """Needles of ``name`` left in ``text``; ``joined``: a sink that holds the lines together, where a
    wrapped token's short head on the first line is redacted too."""
    heads = head_needles(value).get(name, []) if joined else []
    return [n for n in [*needles(value)[name], *heads] if n in text]


@pytest.mark.parametrize("name", FORM_NAMES)
@pytest.mark.parametrize("key", sorted(CREDENTIALS))
def test_every_form_is_redacted_as_printed_in_json_and_line_by_line(key, name):
    value = CREDENTIALS[key]
    printed = forms(value)[name]
    line = f"step 3: push refused ({name}) {printed} -- retrying"
    out = redact(line)
    assert not _left(out, value, name) and REDACTED in out, out
    doc = json.dumps({"log": line, "nested": [{"stderr": line}]})
    redacted = redact(doc)
    assert not _left(redacted, value, name), redacted
    assert not _left(json.dumps(json.loads(redacted), ensure_ascii=False) + str(json.loads(redacted)), value, name)
    assert not _left(json.dumps(redact_obj(json.loads(doc))), value, name)
    lines = [f"[{key}/0 stderr] {piece}" for piece in line.splitlines()]
    assert not _left("\n".join(redact(x) for x in lines), value, name, joined=False)  # one line per sink entry
    assert not _left(redact("\n".join(lines)), value, name)  # our own log files: a prefix on every line


def test_the_forms_exercise_what_they_name():
    """The sentinels do hold what the forms are about: '+' and '/' in the token and in its base64."""
    token = CREDENTIALS["registry.token"]
    b64 = base64.b64encode(token.encode()).decode()
    assert "+" in token and "/" in token and "/" in b64[4:-4] and "+" in b64[4:-4]
    f = forms(token)
    assert "%2b" in f["pct_lower"] and "%252B" in f["pct_double"] and "\\/" in f["json_slash"]
    assert "\\u002b" in f["json_u002b"] and "\\/" in f["b64_json_slash"] and "\n" in f["b64_wrapped"]


@pytest.mark.parametrize("text", [
    "",
    "plain log line with nothing secret: 100% done, \\n escaped, \\u00e9t\\u00e9, a\\/b",
    "sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef and 3f:a0:11 and %2F%2f%252F",
    json.dumps({"lines": ["one", "two\\", "  three"], "url": "https://example.com/a%20b?x=1&y=%252F"}),
    "[amd64-standard/0 stderr] Step 4/12 : RUN pip install -r requirements.txt\n[amd64-standard/0 stdout] ok",
])
def test_text_without_a_secret_is_unchanged(text):
    assert redact(text) == text


def test_a_part_of_a_secret_at_least_min_part_long_is_redacted_anywhere_a_shorter_one_is_kept():
    token = CREDENTIALS["registry.token"]
    assert REDACTED in redact(f"cut: {token[:12]}…") and token[:12] not in redact(f"cut: {token[:12]}…")
    assert REDACTED in redact(f"…{token[-11:]} (tail)")
    assert redact(f"short: {token[:6]}") == f"short: {token[:6]}"
    digest = "sha256:abcdef" + CREDENTIALS["temporal.api_key"][-10:]  # ends like a secret, inside a word
    assert redact(digest) == digest
