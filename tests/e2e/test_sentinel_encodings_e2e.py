"""Redaction of every encoding of every credential, per sink (issue #21 item 3, issue #27 items 1 and 2).

The worker holds three credentials: the registry push token (a sentinel with '+' and '/', in the job's
environment as GHCR_TOKEN), the GitHub token, and a GitHub webhook secret configured for this test. The
stand-in build prints each of them in every form of tests/sentinel_forms.py — raw; hex (either case, ``:``
and space separated, ``\\x``); percent-encoded (upper, lower, every byte, doubled); JSON escapes (``\\/``,
``\\u002b``, ``\\u00XX`` of every character); cut across two lines (bare, indented, a ``\\`` continuation);
base64 and URL-safe base64 with and without padding, at each of the 3 byte alignments after ``user:``,
wrapped, JSON- and percent-escaped — plus ``Authorization`` headers and a docker ``config.json`` auth, then
fails. (The other two kinds of credential, the Temporal API key and an Iris cluster token, need a TLS
frontend and a controller that checks tokens; they take the same path through ``domain.redact`` and are
in tests/domain/test_redact_encodings.py.) The worker learns the non-registry credentials from its
configuration only; the job gets them masked in its script, so no sink could hold them except by a leak.

A real worker process captures the failure. Every sink is then searched for every needle of every form:
Temporal history (pipeline and target), the frontend's HTTP API that the UI reads (the pipeline's describe
with Current Details and its history; the target's list entry) and the client's describe of both (pending
activities, heartbeat details), the Temporal SQLite DB file, the report (query and ``starter.py report``),
the worker's log, and the evidence store. Expected hits: 0 each.

Needles are computed by tests/sentinel_forms.py, independently of ``domain.redact``: a whole encoding, or
for a form that mixes with its neighbours the part that is the same whatever surrounds it.
"""

from __future__ import annotations

import base64
import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import httpx
import pytest
from google.protobuf.json_format import MessageToJson

from domain.config import load_config
from domain.models import Stage
from sandbox.git_remotes import commit_to_remote
from sandbox.stack import to_toml
from tests.e2e.helpers import (
    git_show,
    in_the_real_job_only,
    is_closed,
    request,
    start_pipeline,
    stop_process,
    target_status,
    wait_until,
    worker_process,
)
from tests.sentinel_forms import head_needles, needles

pytestmark = pytest.mark.stack
SCRIPT = "docker/build_gpu_rl_kaniko.sh"
KEY = "amd64-standard"
ROOT = Path(__file__).resolve().parents[2]

MASK = 0x5A
# Runs in the job after tests/sentinel_forms.py: every form of every credential on stderr, one "form" line
# each (a form cut across lines goes on on the next line), then the header shapes, and last the line the
# failure is quoted by (it reaches history, Current Details and the report): forms of each credential,
# the last one cut by a ``\`` continuation, so that line ends with half a token.
DRIVER = """
import os, sys
creds = {"registry.token": os.environ["GHCR_TOKEN"]}
creds.update({k: bytes(b ^ MASK for b in bytes.fromhex(v)).decode() for k, v in MASKED.items()})
user = os.environ["DOCKER_USER_ID"]
for label, value in creds.items():
    for name, text in forms(value, user).items():
        print("form", label, name, text, file=sys.stderr)
t = creds["registry.token"]
basic = base64.b64encode((user + ":" + t).encode()).decode()
print("Authorization: Basic", basic, file=sys.stderr)
print("authorization: Bearer", t, file=sys.stderr)
print('{"auths": {"r": {"auth": "%s"}}}' % basic, file=sys.stderr)
f = {label: forms(value, user) for label, value in creds.items()}
print("error: push refused with", quote(t, safe=""), f["registry.token"]["hex_lower"],
      f["github.webhook.secret"]["pct_double_lower"], f["github.webhook.secret"]["json_u002b"],
      f["github.token"]["split_continuation"], file=sys.stderr)
"""


def _printing_program(others: dict[str, str]) -> str:
    """Shell that runs tests/sentinel_forms.py and DRIVER in the job's python3; ``others`` travel masked."""
    masked = {k: bytes(b ^ MASK for b in v.encode()).hex() for k, v in others.items()}
    source = (Path(__file__).resolve().parents[1] / "sentinel_forms.py").read_text()
    program = f"{source}\nMASK = {MASK}\nMASKED = {masked!r}\n{DRIVER}"
    encoded = base64.b64encode(program.encode()).decode()
    return f"python3 -c 'import base64; exec(base64.b64decode(\"{encoded}\"))'\n"


def _hits(texts: list[str], wanted: dict[str, list[str]]) -> dict[str, int]:
    return {name: sum(t.count(n) for t in texts for n in ns) for name, ns in wanted.items()}


def _with_payloads(text: str) -> str:
    """``text`` (JSON of history or an API response) plus every payload it carries decoded: payload
    ``data`` is base64 in JSON, so a search of the JSON alone would miss what the payloads hold."""
    decoded: list[str] = []

    def walk(node):
        if isinstance(node, dict):
            if isinstance(node.get("data"), str) and "metadata" in node:
                try:
                    decoded.append(base64.b64decode(node["data"]).decode("utf-8", errors="replace"))
                except ValueError:
                    pass
            for v in node.values():
                walk(v)
        elif isinstance(node, list):
            for v in node:
                walk(v)

    walk(json.loads(text))
    return "\n".join([text, *decoded])


def _http_port(server) -> int:
    argv = Path(f"/proc/{server.pid}/cmdline").read_bytes().split(b"\0")
    return int(argv[argv.index(b"--http-port") + 1])


async def test_every_encoding_of_the_token_reaches_no_sink(service_config):
    s = service_config
    user, token = s.token_registry.credentials
    webhook_secret = "wh-s3ntinel+Web/hook=Secret-" + os.urandom(8).hex()
    config_path = _with_webhook_secret(s, webhook_secret)
    creds = {"registry.token": token, "github.token": s.github.token, "github.webhook.secret": webhook_secret}
    # Every needle of every form of every credential, by "credential form".
    wanted = {f"{label} {name}": ns + head_needles(value).get(name, [])
              for label, value in creds.items() for name, ns in needles(value, user).items()}
    script = git_show(s.remotes.marinskyrl_url, "main", SCRIPT)
    program = _printing_program({k: v for k, v in creds.items() if k != "registry.token"})
    leaky = script.replace("unset GHCR_TOKEN\n", in_the_real_job_only(program + "exit 3") + "unset GHCR_TOKEN\n", 1)
    assert leaky != script and token not in leaky and s.github.token not in leaky and webhook_secret not in leaky
    commit_to_remote(s.remotes.marinskyrl_url, {SCRIPT: leaky}, "a build that prints its credentials in every encoding")
    log = s.state_dir / "worker.log"
    worker = worker_process(config_path, log)
    sinks: dict[str, list[str]] = {}
    try:
        handle = await start_pipeline(s, request())
        wid = handle.id
        await wait_until(lambda: _captured(s, wid), timeout=300, what="failure captured")
        # The UI reads the frontend's HTTP API: describe (memo, Current Details, pending activities) + history.
        base = f"http://{s.temporal.address.rsplit(':', 1)[0]}:{_http_port(s.temporal)}/api/v1/namespaces/{s.temporal.namespace}"
        ui = []
        async with httpx.AsyncClient(base_url=base, timeout=30) as http:
            for path in (f"/workflows/{wid}", f"/workflows/{wid}/history"):
                resp = await http.get(path)
                assert resp.status_code == 200, (path, resp.text[:300])
                ui.append(_with_payloads(resp.text))
            # The HTTP API cannot route a '/' in a workflow id (the target's): its list entry instead.
            resp = await http.get("/workflows", params={"query": f'WorkflowId="{wid}/{KEY}"'})
            assert resp.status_code == 200 and KEY in resp.text, resp.text[:300]
            ui.append(_with_payloads(resp.text))
        sinks["ui_http_api"] = ui
        sinks["describe"] = [_with_payloads(MessageToJson((await s.client.get_workflow_handle(w).describe())
                                                          .raw_description)) for w in (wid, f"{wid}/{KEY}")]
        await handle.cancel()
        await wait_until(lambda: is_closed(s.client, wid), timeout=120, what="pipeline closed")
    finally:
        assert stop_process(worker) is not None
    sinks["history"] = [_with_payloads((await s.client.get_workflow_handle(w).fetch_history()).to_json())
                        for w in (wid, f"{wid}/{KEY}")]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    cli = subprocess.run([sys.executable, str(ROOT / "starter.py"), "--config", str(config_path), "report", wid,
                          "--format", "json"], capture_output=True, text=True, timeout=120, env=env, cwd=ROOT)
    assert cli.stdout.strip(), cli.stderr
    text = subprocess.run([sys.executable, str(ROOT / "starter.py"), "--config", str(config_path), "report", wid],
                          capture_output=True, text=True, timeout=120, env=env, cwd=ROOT)
    sinks["report"] = [cli.stdout, cli.stderr, text.stdout, text.stderr]
    db = [p for p in s.temporal.db_path.parent.glob(s.temporal.db_path.name + "*") if p.is_file()]
    sinks["temporal_db"] = [p.read_bytes().decode("latin-1") for p in db]
    sinks["worker_log"] = [log.read_text(errors="replace")]
    evidence = [p for p in Path(s.config.evidence_url()).rglob("*") if p.is_file()]
    sinks["evidence"] = [p.read_text(errors="replace") for p in evidence]

    table = {sink: _hits(texts, wanted) for sink, texts in sinks.items()}
    width = max(map(len, wanted))
    print("\nsentinel hits per credential, encoding and sink")
    print(f"{'credential encoding':<{width}} " + " ".join(f"{k:>12}" for k in table))
    for name in wanted:
        print(f"{name:<{width}} " + " ".join(f"{table[k][name]:>12}" for k in table))
    # The build did print every form of every credential (so 0 hits is not vacuous): its redacted log is
    # in the evidence, one "form <credential> <encoding>" line each, redacted (a wrapped stream's first
    # line holds only the prefix's base64, and redaction may take the label's last word with a cut form).
    printed = "".join(p.read_text(errors="replace") for p in evidence if p.suffix == ".log")
    lines = {" ".join(line.split("] form ", 1)[1].split()[:2]): line
             for line in printed.splitlines() if "] form " in line}
    assert sorted(lines) == sorted(wanted), sorted(set(wanted) ^ set(lines))
    assert all("[REDACTED]" in line for key, line in lines.items() if not key.endswith("b64_wrapped")), printed[-3000:]
    # The failing line reached history and the DB, redacted; the UI's view names the failed target
    # (decoded payloads searched, not only their base64).
    quoted = "push refused with [REDACTED] [REDACTED] [REDACTED] "
    for sink in ("history", "temporal_db"):
        assert any(quoted in t for t in sinks[sink]), sink
    assert all(KEY in t for t in sinks["ui_http_api"])
    assert all(n == 0 for row in table.values() for n in row.values()), table


def _with_webhook_secret(s, secret: str) -> Path:
    """The stack's configuration plus a GitHub webhook receiver whose secret is ``secret`` (a file source),
    so the worker knows a third credential."""
    (s.state_dir / "secrets" / "webhook-secret").write_text(secret + "\n")
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    import tomllib

    data = tomllib.loads(s.config_path.read_text())
    data["github"]["webhook"] = {"listen": f"127.0.0.1:{port}",
                                 "secret": {"kind": "file", "path": str(s.state_dir / "secrets" / "webhook-secret")}}
    path = s.state_dir / "config-webhook.toml"
    path.write_text(to_toml(data))
    load_config(path)
    return path


async def _captured(s, wid):
    st = await target_status(s.client, wid, KEY)
    return st if st and st.stage in (Stage.WAITING, Stage.FAILED) and st.failure_class else None
