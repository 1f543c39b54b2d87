"""starter.py's machine output (``report --format json``, every ``--json``) goes through the same terminal
redactor as its other output (issue #36): a registered secret, raw, split by colour codes or base64'd
inside a string, does not reach stdout, a token shape is redacted unregistered, a raw C1 control is escaped,
and the output is still one valid JSON document. The old starter printed ``model_dump_json`` as it was.

Sentinels are random (the redactor's registry is process-wide)."""

from __future__ import annotations

import base64
import json
import os
import re

from domain.buildset import BuildRequest, CompatibilityRequest
from domain.models import FailureInfo, PipelineReport
from domain.redact import REDACTED, register_secret

_SGR = re.compile(r"\x1b\[[0-9;]*m")


def _sentinel() -> str:
    secret = "s3ntinel-JSON/" + os.urandom(10).hex()
    register_secret(secret)
    return secret


def _forms(secret: str) -> list[str]:
    return [secret, f"{secret[:11]}\x1b[31m{secret[11:]}\x1b[0m",
            base64.b64encode(f"builder:{secret}".encode()).decode()]


def _leaks(out: str, secret: str) -> list[str]:
    """Where ``secret`` still shows: in the printed text, or in any string a JSON reader gets from it (with
    colour codes removed, as a terminal shows them)."""
    doc = json.loads(out)
    strings: list[str] = []

    def walk(x):
        if isinstance(x, str):
            strings.append(x)
        elif isinstance(x, dict):
            for v in x.values():
                walk(v)
        elif isinstance(x, list):
            for v in x:
                walk(v)

    walk(doc)
    found = [s for s in [out, *strings] if secret in _SGR.sub("", s)]
    for s in strings:
        for word in re.findall(r"[A-Za-z0-9+/=]{16,}", s):
            try:
                if secret in base64.b64decode(word).decode(errors="replace"):
                    found.append(word)
            except ValueError:
                pass
    return found


def test_report_format_json_goes_through_the_terminal_redactor(capsys):
    import starter

    secret = _sentinel()
    raw, split, b64 = _forms(secret)
    shaped = "ghp_" + "Unregistered0Shape1Token2AbCdEf"  # a token shape nobody registered
    rep = PipelineReport(
        workflow_id="wf-json-redacted", status="failed", message=f"push refused for {raw}",
        request=BuildRequest(architectures=["amd64"], variants=["standard"],
                             compatibility_request=CompatibilityRequest(requested_by="test", reason=f"see {shaped}")),
        failure=FailureInfo(failure_class="registry", error_type="PushFailed", message=f"token {split} refused",
                            next_step=f"check the header Basic {b64} \x9b2J and retry"))
    starter._print_report(rep, True)  # report --format json, build/resume --json
    out = capsys.readouterr().out
    assert _leaks(out, secret) == [], out
    assert shaped not in out and "\x9b" not in out and "\\u009b" in out, out
    doc = json.loads(out)
    assert doc["workflow_id"] == "wf-json-redacted" and REDACTED in doc["message"]
    assert REDACTED in doc["failure"]["message"] and REDACTED in doc["failure"]["next_step"]


def test_every_json_listing_goes_through_the_terminal_redactor(capsys):
    """status, schedule list/describe, evidence and a rebuild check's report print rows or a dict:
    the same path (``_echo_json``)."""
    import starter

    secret = _sentinel()
    rows = [{"workflow_id": f"wf-{i}", "details": form, "url": f"https://x.invalid/a?t={form}"}
            for i, form in enumerate(_forms(secret))]
    starter._echo_json(rows)
    out = capsys.readouterr().out
    assert _leaks(out, secret) == [], out
    assert [r["workflow_id"] for r in json.loads(out)] == ["wf-0", "wf-1", "wf-2"]
