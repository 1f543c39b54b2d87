"""Redaction of every encoding, per sink (issue #21 item 3).

The stand-in build prints the registry push token (a sentinel with '+' and '/') in every form a tool
prints it — raw, URL-encoded (quote, quote_plus), base64 and URL-safe base64 with and without padding,
base64(user:token) at each of the 3 byte alignments, ``Authorization: Basic/Bearer`` headers and a
docker ``config.json`` auth — then fails. A real worker process captures the failure. Every sink is
then searched for every form: Temporal history (pipeline and target), the frontend's HTTP API that the
UI reads (the pipeline's describe with Current Details and its history; the target's list entry) and the
client's describe of both (pending activities, heartbeat details), the Temporal SQLite DB file, the report
(query and ``starter.py report``), the worker's log, and the evidence store. Expected hits: 0 each.

Needles are computed here independently of ``domain.redact``: a whole encoding, or for a token inside a
longer base64 stream the stream with its prefix characters and last characters trimmed.
"""

from __future__ import annotations

import base64
import json
import os
import subprocess
import sys
from pathlib import Path
from urllib.parse import quote, quote_plus

import httpx
import pytest
from google.protobuf.json_format import MessageToJson

from domain.models import Stage
from sandbox.git_remotes import commit_to_remote
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

pytestmark = pytest.mark.stack
SCRIPT = "docker/build_gpu_rl_kaniko.sh"
KEY = "amd64-standard"
ROOT = Path(__file__).resolve().parents[2]

# The job prints every form on stderr (the token is in its environment as GHCR_TOKEN, the user as DOCKER_USER_ID).
PRINT_FORMS = (
    "python3 -c 'import base64,os,urllib.parse as u;t=os.environ[\"GHCR_TOKEN\"];n=os.environ[\"DOCKER_USER_ID\"];"
    "b=t.encode();e=base64.b64encode;w=base64.urlsafe_b64encode;"
    "print(\"form raw\",t);print(\"form quote\",u.quote(t,safe=\"\"));print(\"form quote_plus\",u.quote_plus(t));"
    "print(\"form b64\",e(b).decode());print(\"form b64_nopad\",e(b).decode().rstrip(\"=\"));"
    "print(\"form urlsafe\",w(b).decode());print(\"form urlsafe_nopad\",w(b).decode().rstrip(\"=\"));"
    "[print(\"form basic_%d\" % k,e((\"x\"*k+n+\":\"+t).encode()).decode()) for k in (0,1,2)];"
    "print(\"Authorization: Basic\",e((n+\":\"+t).encode()).decode());print(\"authorization: Bearer\",t);"
    "print(\"{\\\"auths\\\": {\\\"r\\\": {\\\"auth\\\": \\\"%s\\\"}}}\" % e((n+\":\"+t).encode()).decode());"
    "print(\"error: push refused with\",u.quote(t,safe=\"\"))' >&2\n"
)


def needles(user: str, token: str) -> dict[str, str]:
    raw = token.encode()
    out = {"raw": token, "quote": quote(token, safe=""), "quote_plus": quote_plus(token),
           "b64": base64.b64encode(raw).decode(), "b64_nopad": base64.b64encode(raw).decode().rstrip("="),
           "urlsafe": base64.urlsafe_b64encode(raw).decode(),
           "urlsafe_nopad": base64.urlsafe_b64encode(raw).decode().rstrip("=")}
    for k in (0, 1, 2):
        prefix = "x" * k + user + ":"
        stream = base64.b64encode((prefix + token).encode()).decode()
        out[f"basic_user_token_align{(len(prefix)) % 3}"] = stream[len(prefix) * 4 // 3 + 2:-3]
    assert out["quote"] != token and all(len(v) >= 16 for v in out.values()), out
    return out


def _hits(texts: list[str], forms: dict[str, str]) -> dict[str, int]:
    return {name: sum(t.count(needle) for t in texts) for name, needle in forms.items()}


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
    forms = needles(user, token)
    script = git_show(s.remotes.marinskyrl_url, "main", SCRIPT)
    leaky = script.replace("unset GHCR_TOKEN\n", in_the_real_job_only(PRINT_FORMS + "exit 3") + "unset GHCR_TOKEN\n", 1)
    assert leaky != script
    commit_to_remote(s.remotes.marinskyrl_url, {SCRIPT: leaky}, "a build that prints its token in every encoding")
    log = s.state_dir / "worker.log"
    worker = worker_process(s.config_path, log)
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
    cli = subprocess.run([sys.executable, str(ROOT / "starter.py"), "--config", str(s.config_path), "report", wid,
                          "--format", "json"], capture_output=True, text=True, timeout=120, env=env, cwd=ROOT)
    assert cli.stdout.strip(), cli.stderr
    text = subprocess.run([sys.executable, str(ROOT / "starter.py"), "--config", str(s.config_path), "report", wid],
                          capture_output=True, text=True, timeout=120, env=env, cwd=ROOT)
    sinks["report"] = [cli.stdout, cli.stderr, text.stdout, text.stderr]
    db = [p for p in s.temporal.db_path.parent.glob(s.temporal.db_path.name + "*") if p.is_file()]
    sinks["temporal_db"] = [p.read_bytes().decode("latin-1") for p in db]
    sinks["worker_log"] = [log.read_text(errors="replace")]
    evidence = [p for p in Path(s.config.evidence_url()).rglob("*") if p.is_file()]
    sinks["evidence"] = [p.read_text(errors="replace") for p in evidence]

    table = {sink: _hits(texts, forms) for sink, texts in sinks.items()}
    width = max(map(len, forms))
    print("\nsentinel hits per encoding and sink")
    print(f"{'encoding':<{width}} " + " ".join(f"{k:>12}" for k in table))
    for name in forms:
        print(f"{name:<{width}} " + " ".join(f"{table[k][name]:>12}" for k in table))
    # The build did print every form (so 0 hits is not vacuous): its redacted log is in the evidence.
    printed = "".join(t for t in sinks["evidence"] if "form raw" in t)
    lines = {line.split("form ", 1)[1].split()[0]: line for line in printed.splitlines() if "] form " in line}
    assert sorted(lines) == sorted(["raw", "quote", "quote_plus", "b64", "b64_nopad", "urlsafe", "urlsafe_nopad",
                                    "basic_0", "basic_1", "basic_2"]), printed[-3000:]
    assert all("[REDACTED]" in line for line in lines.values())
    # The failing line ("error: push refused with <quoted token>") reached history and the DB, redacted;
    # the UI's view names the failed target (decoded payloads searched, not only their base64).
    assert any("push refused with [REDACTED]" in t for t in sinks["history"])
    assert any("push refused with [REDACTED]" in t for t in sinks["temporal_db"])
    assert all(KEY in t for t in sinks["ui_http_api"])
    assert all(n == 0 for row in table.values() for n in row.values()), table


async def _captured(s, wid):
    st = await target_status(s.client, wid, KEY)
    return st if st and st.stage in (Stage.WAITING, Stage.FAILED) and st.failure_class else None
