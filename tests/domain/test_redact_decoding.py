"""Decode before matching (issue #36 item 2): nested and encoded forms are redacted, what merely looks
encoded is not, and every sink uses the same redactor.

The forms (tests/sentinel_forms.py ``_decoded_forms``: a base64'd ``.dockerconfigjson``, double base64,
base32, gzip+base64, UTF-16LE/BE hex, base64 of UTF-16LE, octal escapes, a token split by ANSI colour
codes, quoted-printable with a soft line break, 80/120-column wraps of an ``iris job logs`` line, xxd
(default, -g 1, -e), od -x, hexdump -C) go through tests/domain/test_redact_encodings.py with the rest;
here: the controls, the sinks that are not Temporal's (the terminal, PR and issue bodies, the evidence
store, the worker log), and the limits.
"""

from __future__ import annotations

import base64
import gzip
import hashlib
import io
import json
import logging
import os
import random

import pytest

from domain.redact import REDACTED, redact

# _registered (autouse): exactly the five credentials registered, as in the encodings table's tests.
from tests.domain.test_redact_encodings import CREDENTIALS, _registered  # noqa: F401
from tests.sentinel_forms import forms, head_needles, needles

DECODED = ("dockerconfigjson_b64", "b64_double", "base32", "gzip_b64", "utf16le_hex", "utf16be_hex", "utf16le_b64",
           "octal_escape", "ansi_split", "quoted_printable", "iris_wrap80", "iris_wrap120", "iris_wrap80_bare",
           "xxd", "xxd_g1", "xxd_e", "od_x", "hexdump_c")


def _controls() -> list[str]:
    """What looks encoded and must stay: commit SHAs, digests, base64 layer ids, hex and base64 of data."""
    rng = random.Random(36)
    out = []
    for _ in range(20):
        blob = rng.randbytes(32)
        out += [hashlib.sha1(blob).hexdigest(), "sha256:" + hashlib.sha256(blob).hexdigest(),
                base64.b64encode(blob).decode(), base64.urlsafe_b64encode(rng.randbytes(33)).decode(),
                base64.b32encode(rng.randbytes(20)).decode(), " ".join(f"{b:02x}" for b in rng.randbytes(16))]
    # Text that decodes to text without a secret: base64 of a config, gzip of a log line, a hex dump.
    out.append(base64.b64encode(json.dumps({"credsStore": "desktop", "auths": {"ghcr.io": {}}}).encode()).decode())
    out.append(base64.b64encode(gzip.compress(b"Step 4/12 : RUN pip install torch", mtime=0)).decode())
    out.append("00000000: 5374 6570 2034 2f31 3220 3a20 5255 4e20  Step 4/12 : RUN ")
    out.append("ghcr.io/marin-community/marinskyrl@sha256:" + "ab" * 32)
    return out


def test_controls_are_untouched_alone_and_next_to_every_decoded_form():
    controls = _controls()
    text = "\n".join(controls)
    assert redact(text) == text
    assert redact(json.dumps({"lines": controls})) == json.dumps({"lines": controls})
    for value in CREDENTIALS.values():
        for name in DECODED:
            doc = "\n".join([controls[0], f"layer {controls[2]} {forms(value)[name]} {controls[1]}", *controls[3:8]])
            out = redact(doc)
            wanted = [*needles(value)[name], *head_needles(value).get(name, [])]
            assert REDACTED in out and not [n for n in wanted if n in out], (name, out)
            for c in (controls[0], controls[1], controls[2], *controls[3:8]):
                assert c in out, (name, c)


def test_the_old_redactor_missed_what_the_new_one_finds():
    """The same table on the redactor before this change (loaded from git): each decoded form leaked."""
    import importlib.util
    import subprocess
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    old = subprocess.run(["git", "-C", str(root), "show", "a421c84:domain/redact.py"], capture_output=True, text=True)
    if old.returncode != 0:
        pytest.skip("the previous domain/redact.py is not in this checkout's history")
    path = Path(os.environ.get("TMPDIR", "/tmp")) / f"redact_before_{os.getpid()}.py"
    path.write_text(old.stdout)
    spec = importlib.util.spec_from_file_location("redact_before", path)
    before = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(before)
    path.unlink()
    for value in CREDENTIALS.values():
        before.register_secret(value)
    leaked = {name for name in DECODED for value in CREDENTIALS.values()
              if any(n in before.redact(f"x {forms(value)[name]} y")
                     for n in [*needles(value)[name], *head_needles(value).get(name, [])])}
    # A bare wrap (no prefix on the continuation line) was crossed before too.
    assert leaked == set(DECODED) - {"iris_wrap80_bare"}, sorted(set(DECODED) - leaked)


def test_the_terminal_strips_escapes_before_it_redacts():
    """starter stdout/stderr: ``printable`` used to strip colour codes after the worker's redaction, joining
    a split token; it strips first and redacts the result (registered secrets and token shapes)."""
    from domain.terminal_text import printable

    value = CREDENTIALS["registry.token"]
    shaped = "ghp_" + "Unregistered0Shape1Token2AbCdEf"  # a token shape the starter never registered
    for text in (f"error: push refused: {forms(value)['ansi_split']}",
                 f"error: {shaped[:9]}\x1b[31m{shaped[9:]}\x1b[0m refused"):
        out = printable(text)
        assert value not in out and shaped not in out and REDACTED in out, out


def test_nested_layers_and_limits():
    value = CREDENTIALS["github.webhook.secret"]
    inner = base64.b64encode(gzip.compress(json.dumps({"auth": base64.b64encode(value.encode()).decode()}).encode(),
                                           mtime=0)).decode()
    assert value not in redact(base64.b64decode(inner).decode("latin-1"))
    out = redact(f"blob {base64.b64encode(inner.encode()).decode()} end")  # base64(base64(gzip(json(base64))))
    assert REDACTED in out and out.startswith("blob ") and out.endswith(" end")
    bomb = base64.b64encode(gzip.compress(b"A" * (64 << 20))).decode()  # inflates past MAX_INFLATE: bounded
    assert redact(f"x {bomb} y") == f"x {bomb} y"


async def test_pr_and_issue_bodies_are_redacted_by_the_client(github_standin):
    """The GitHub client redacts what it writes (PR title and body, issue comments): the stand-in stores
    none of the needles of any form."""
    gh = github_standin
    body = "\n".join(f"{name}: {text}" for value in CREDENTIALS.values() for name, text in forms(value).items())
    wanted = [n for value in CREDENTIALS.values() for ns in needles(value).values() for n in ns]
    async with gh.client() as client:
        pull = await client.create_pull("feature", "main", f"pin {CREDENTIALS['registry.token']}", body)
        await client.update_pull(pull.number, body=body + "\nupdated")
        comment = await client.comment_issue(pull.number, body)
        await client.update_comment(comment.id, body + "\nedited")
        stored = [await client.get_pull(pull.number), *await client.list_issue_comments(pull.number)]
    texts = [p.model_dump_json() for p in stored]
    assert all(REDACTED in t for t in texts)
    assert [n for n in wanted if any(n in t for t in texts)] == []


def test_evidence_and_the_worker_log_use_the_same_redactor(tmp_path):
    from clients.evidence import EvidenceStore
    from runtime.logging import configure_logging, get_logger

    text = "\n".join(f"{name}: {t}" for value in CREDENTIALS.values() for name, t in forms(value).items())
    wanted = [n for value in CREDENTIALS.values() for ns in needles(value).values() for n in ns]
    store = EvidenceStore(str(tmp_path / "evidence"))
    ref = store.put_text("wf", "amd64-standard-job.log", text)
    stored = "".join(p.read_text(errors="replace") for p in (tmp_path / "evidence").rglob("*") if p.is_file())
    assert ref and REDACTED in stored and [n for n in wanted if n in stored] == []
    stream = io.StringIO()
    configure_logging("INFO", stream=stream)
    try:
        get_logger("test").warning("a build printed", output=text)
        logging.getLogger("temporalio.activity").warning("an activity printed %s", text)
    finally:
        configure_logging("INFO")
    logged = stream.getvalue()
    assert "a build printed" in logged and "an activity printed" in logged
    assert [n for n in wanted if n in logged] == []


@pytest.mark.parametrize("text", [
    "before \x9b\xe9 after",  # a lone C1 CSI with no final byte: control stripping removed nothing
    "dump: " + "9be9" * 20,  # hex whose bytes decode (latin-1) to lone CSIs, as a build log's xxd may hold
])
def test_a_lone_c1_control_ends_and_the_secret_beside_it_is_still_redacted(text):
    """A lone \\x9b once made ``_spans`` strip nothing and call itself again until RecursionError, so the
    evidence write of a failed build's log (capture_failure) failed on every retry. The secret beside it
    must still be found."""
    secret = next(iter(CREDENTIALS.values()))
    out = redact(f"{text} {secret} {secret.encode().hex()}")
    assert secret not in out and secret.encode().hex() not in out
    assert REDACTED in out
