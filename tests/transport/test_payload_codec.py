"""Every byte to Temporal passes one codec (issue #36 item 1): a sentinel credential put into every kind of
payload reaches no sink unencoded.

A workflow run by a real worker against the suite's real Temporal dev server (SQLite) puts a registered
sentinel into its input, an activity result, an activity's heartbeat details, an activity exception's
message and details, a memo, Current Details, a query result, an update's input and result, a signal and
the workflow's own failure (message and details). Then every sink is searched: history fetched by a client
without the codec, the raw describe, the frontend's HTTP API that the UI reads (describe, history and the
query, payloads base64-decoded), and the Temporal DB files. Three runs:

- ``plain`` (the converter the worker used before: pydantic, no codec): the sentinel is found in every sink,
  so the search is not vacuous and the test fails on the old converter;
- ``redacted`` (no keys: the sandbox's codec): 0 hits, and the redacted marker is there in its place;
- ``encrypted`` (a key, as in production): 0 hits, no payload readable, and the codec server decodes the
  history's payloads for an operator's token only (401 without, CORS for the UI's origin).
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import os
import uuid
from collections.abc import AsyncIterator
from datetime import timedelta
from pathlib import Path

import httpx
import pytest
from google.protobuf.json_format import MessageToJson
from temporalio import activity, workflow
from temporalio.client import Client, WorkflowFailureError, WorkflowUpdateStage
from temporalio.common import RetryPolicy
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.exceptions import ActivityError, ApplicationError
from temporalio.worker import UnsandboxedWorkflowRunner, Worker

from domain.redact import REDACTED, register_secret
from runtime.codec_server import CodecApp, CodecServer
from runtime.payload_codec import Keys, RedactingCodec, data_converter

pytestmark = pytest.mark.stack
_release: dict[str, asyncio.Event] = {}
# The sentinel by workflow id: the worker's code uses it raw (the input it is started with is redacted by
# the starter's own codec already).
_secret: dict[str, str] = {}


@activity.defn
async def give(_input: str) -> dict:
    sentinel = _secret[activity.info().workflow_id]
    return {"result": f"result {sentinel}", "nested": [{"token": sentinel}]}


@activity.defn
async def beat(_input: str) -> str:
    sentinel = _secret[activity.info().workflow_id]
    activity.heartbeat({"progress": f"heartbeat {sentinel}"})
    await _release[activity.info().workflow_id].wait()
    return "done"


@activity.defn
async def fail(_input: str) -> str:
    sentinel = _secret[activity.info().workflow_id]
    raise ApplicationError(f"activity failed: {sentinel}", {"report": f"details {sentinel}"}, non_retryable=True)


@workflow.defn
class SentinelWorkflow:
    def __init__(self) -> None:
        self.sentinel = ""
        self.signalled = ""

    @workflow.run
    async def run(self, given: str) -> str:
        sentinel = self.sentinel = _secret[workflow.info().workflow_id]
        workflow.upsert_memo({"note": f"memo {sentinel}"})
        workflow.set_current_details(f"current details {sentinel}")
        opts = {"start_to_close_timeout": timedelta(seconds=60), "retry_policy": RetryPolicy(maximum_attempts=1)}
        got = await workflow.execute_activity(give, f"activity input {sentinel} {given}", **opts)
        await workflow.execute_activity(beat, sentinel, heartbeat_timeout=timedelta(seconds=60), **opts)
        try:
            await workflow.execute_activity(fail, sentinel, **opts)
        except ActivityError:
            pass
        await workflow.wait_condition(lambda: bool(self.signalled))
        raise ApplicationError(f"workflow failed: {got['result']}", {"report": f"failure details {sentinel}"})

    @workflow.query
    def peek(self) -> str:
        return f"query {self.sentinel}"

    @workflow.update
    def poke(self, arg: str) -> str:
        return f"update {arg} {self.sentinel}"

    @workflow.signal
    def finish(self, arg: str) -> None:
        self.signalled = arg


def _with_payloads(text: str) -> str:
    """JSON plus every payload's ``data`` base64-decoded (the HTTP API and history JSON carry it base64)."""
    decoded: list[str] = []

    def walk(node):
        if isinstance(node, dict):
            if isinstance(node.get("data"), str):
                try:
                    decoded.append(base64.b64decode(node["data"]).decode("latin-1"))
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


async def _run(server, converter, sentinel: str, queue: str) -> tuple[str, dict[str, list[str]]]:
    """Run the workflow with ``converter`` on both the worker and the starter; every sink's text."""
    client = await Client.connect(server.address, namespace=server.namespace, data_converter=converter)
    raw = await Client.connect(server.address, namespace=server.namespace)  # no codec: what is stored
    wid = f"sentinel-{uuid.uuid4().hex[:8]}"
    _release[wid] = asyncio.Event()
    _secret[wid] = sentinel
    sinks: dict[str, list[str]] = {"describe": [], "ui_http_api": []}
    async with Worker(client, task_queue=queue, workflows=[SentinelWorkflow], activities=[give, beat, fail],
                      workflow_runner=UnsandboxedWorkflowRunner()):
        handle = await client.start_workflow(SentinelWorkflow.run, f"input {sentinel}", id=wid, task_queue=queue,
                                             memo={"started": f"start memo {sentinel}"})
        for _ in range(300):  # the heartbeat is pending: describe and the UI see it now
            desc = await raw.get_workflow_handle(wid).describe()
            if any(p.heartbeat_details.payloads for p in desc.raw_description.pending_activities):
                break
            await asyncio.sleep(0.1)
        else:
            raise AssertionError("no heartbeat seen")
        sinks["describe"].append(MessageToJson(desc.raw_description))
        base = f"http://{server.address.rsplit(':', 1)[0]}:{_http_port(server)}/api/v1/namespaces/{server.namespace}"
        async with httpx.AsyncClient(base_url=base, timeout=30) as http:
            resp = await http.get(f"/workflows/{wid}")
            assert resp.status_code == 200, resp.text[:300]
            sinks["ui_http_api"].append(resp.text)
            _release[wid].set()
            assert (await handle.query(SentinelWorkflow.peek)).startswith("query ")
            resp = await http.post(f"/workflows/{wid}/query/peek", json={"query": {"queryType": "peek"}})
            assert resp.status_code == 200, resp.text[:300]
            sinks["ui_http_api"].append(resp.text)
            await handle.execute_update(SentinelWorkflow.poke, f"update input {sentinel}")
            await handle.start_update(SentinelWorkflow.poke, f"again {sentinel}",
                                      wait_for_stage=WorkflowUpdateStage.COMPLETED)
            await handle.signal(SentinelWorkflow.finish, f"signal {sentinel}")
            with pytest.raises(WorkflowFailureError) as failed:
                await handle.result()
            resp = await http.get(f"/workflows/{wid}/history")
            assert resp.status_code == 200, resp.text[:300]
            sinks["ui_http_api"].append(resp.text)
            resp = await http.get(f"/workflows/{wid}")
            sinks["ui_http_api"].append(resp.text)
    sinks["ui_http_api"] = [_with_payloads(t) for t in sinks["ui_http_api"]]
    sinks["describe"].append(MessageToJson((await raw.get_workflow_handle(wid).describe()).raw_description))
    sinks["describe"] = [_with_payloads(t) for t in sinks["describe"]]
    history = (await raw.get_workflow_handle(wid).fetch_history()).to_json()
    sinks["history"] = [_with_payloads(history)]
    sinks["_history_json"] = [history]
    db = [p for p in server.db_path.parent.glob(server.db_path.name + "*") if p.is_file()]
    sinks["temporal_db"] = [p.read_bytes().decode("latin-1") for p in db]
    # What the reading client (with the codec) gets back: the failure's own message, redacted.
    cause = failed.value.cause
    sinks["_client_view"] = [str(cause), json.dumps(getattr(cause, "details", None), default=str)]
    return wid, sinks


def _hits(sinks: dict[str, list[str]], sentinel: str) -> dict[str, int]:
    forms = {sentinel, base64.b64encode(sentinel.encode()).decode()[:-4]}
    return {k: sum(t.count(f) for t in texts for f in forms) for k, texts in sinks.items() if not k.startswith("_")}


async def test_a_sentinel_in_every_payload_reaches_no_sink_unencoded(temporal_dev_server):
    server = temporal_dev_server
    queue = f"codec-{uuid.uuid4().hex[:8]}"

    control = "s3ntinel-PLAIN-" + os.urandom(8).hex()
    register_secret(control)
    _, plain = await _run(server, pydantic_data_converter, control, queue + "-plain")
    leaked = _hits(plain, control)
    print("\nthe converter without the codec, sentinel hits per sink:", leaked)
    assert all(n > 0 for n in leaked.values()), leaked  # the search finds what the old converter stored

    sentinel = "s3ntinel-REDACT-" + os.urandom(8).hex()
    register_secret(sentinel)
    _, redacted = await _run(server, data_converter(RedactingCodec()), sentinel, queue + "-redacted")
    print("the codec (redaction), sentinel hits per sink:", _hits(redacted, sentinel))
    assert all(n == 0 for n in _hits(redacted, sentinel).values()), _hits(redacted, sentinel)
    assert any(REDACTED in t for t in redacted["history"]) and any(REDACTED in t for t in redacted["temporal_db"])
    # Failure messages travel encoded (encode_common_attributes); the client still reads them, redacted.
    assert "Encoded failure" in redacted["history"][0]
    assert f"workflow failed: result {REDACTED}" in redacted["_client_view"][0], redacted["_client_view"]

    secret = "s3ntinel-CRYPT-" + os.urandom(8).hex()
    register_secret(secret)
    key = os.urandom(32)
    codec = RedactingCodec(Keys(primary="k2", by_id={"k2": key, "k1": os.urandom(32)}))
    wid, sealed = await _run(server, data_converter(codec), secret, queue + "-encrypted")
    print("the codec (redaction + AES-GCM), sentinel hits per sink:", _hits(sealed, secret))
    assert all(n == 0 for n in _hits(sealed, secret).values()), _hits(sealed, secret)
    assert f"workflow failed: result {REDACTED}" in sealed["_client_view"][0]
    history = json.loads(sealed["_history_json"][0])
    payloads = _payloads(history)
    assert payloads and all(base64.b64decode(p["metadata"]["encoding"]) == b"binary/encrypted" for p in payloads)
    assert all(base64.b64decode(p["metadata"]["encryption-key-id"]) == b"k2" for p in payloads)
    await _codec_server_decodes(codec, server.namespace, payloads, secret)


def _payloads(node) -> list[dict]:
    found = []
    if isinstance(node, dict):
        if isinstance(node.get("metadata"), dict) and "encoding" in node["metadata"]:
            found.append(node)
        for v in node.values():
            found += _payloads(v)
    elif isinstance(node, list):
        for v in node:
            found += _payloads(v)
    return found


async def _codec_server_decodes(codec: RedactingCodec, namespace: str, payloads: list[dict], secret: str) -> None:
    token = "operator-token-" + os.urandom(8).hex()
    server = CodecServer(CodecApp(codec, namespace, [token]), "127.0.0.1", 0, ["https://temporal.example.org"])
    try:
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{server.port}", timeout=30) as http:
            body = {"payloads": [{"metadata": p["metadata"], "data": p.get("data", "")} for p in payloads]}
            headers = {"X-Namespace": namespace, "Content-Type": "application/json"}
            assert (await http.post("/decode", json=body, headers=headers)).status_code == 401
            bad = await http.post("/decode", json=body, headers={**headers, "Authorization": "Bearer nope"})
            assert bad.status_code == 401
            other = await http.post("/decode", json=body, headers={**headers, "X-Namespace": "other",
                                                                    "Authorization": f"Bearer {token}"})
            assert other.status_code == 403
            ok = await http.post("/decode", json=body, headers={**headers, "Authorization": f"Bearer {token}"})
            assert ok.status_code == 200, ok.text[:300]
            decoded = ok.json()["payloads"]
            assert len(decoded) == len(payloads)
            texts = [base64.b64decode(p.get("data", "")).decode() for p in decoded]
            assert all(base64.b64decode(p["metadata"]["encoding"]) != b"binary/encrypted" for p in decoded)
            joined = "\n".join(texts)
            assert "activity failed: [REDACTED]" in joined and "memo [REDACTED]" in joined, joined[:2000]
            assert secret not in joined
            # Encode for the UI (a signal typed there): redacted, then encrypted with the primary key.
            enc = await http.post("/encode", headers={**headers, "Authorization": f"Bearer {token}"}, json={
                "payloads": [{"metadata": {"encoding": base64.b64encode(b"json/plain").decode()},
                              "data": base64.b64encode(json.dumps(f"typed {secret}").encode()).decode()}]})
            assert enc.status_code == 200
            (sealed,) = enc.json()["payloads"]
            assert base64.b64decode(sealed["metadata"]["encryption-key-id"]) == b"k2"
            (back,) = await codec.decode([_to_proto(sealed)])
            assert json.loads(back.data) == f"typed {REDACTED}"
            # The browser's preflight from the UI's origin is allowed; another origin's is not.
            pre = {"Origin": "https://temporal.example.org", "Access-Control-Request-Method": "POST",
                   "Access-Control-Request-Headers": "authorization,content-type,x-namespace"}
            allowed = await http.options("/decode", headers=pre)
            assert allowed.status_code == 200
            assert allowed.headers["access-control-allow-origin"] == "https://temporal.example.org"
            denied = await http.options("/decode", headers={**pre, "Origin": "https://evil.example"})
            assert "access-control-allow-origin" not in denied.headers
            big = await http.post("/decode", content=b"x" * (5 * 1024 * 1024),
                                  headers={**headers, "Authorization": f"Bearer {token}"})
            assert big.status_code == 413
    finally:
        server.close()


def _to_proto(d: dict):
    from google.protobuf.json_format import ParseDict
    from temporalio.api.common.v1 import Payload

    return ParseDict(d, Payload())


async def test_a_payload_under_a_key_no_longer_configured_is_refused_by_name():
    from runtime.payload_codec import CodecError

    old = RedactingCodec(Keys(primary="old", by_id={"old": os.urandom(32)}))
    (sealed,) = await old.encode([pydantic_data_converter.payload_converter.to_payload("x")])
    new = RedactingCodec(Keys(primary="new", by_id={"new": os.urandom(32)}))
    with pytest.raises(CodecError, match="key id 'old'"):
        await new.decode([sealed])
    rotated = RedactingCodec(Keys(primary="new", by_id={"new": os.urandom(32), "old": old.keys.by_id["old"]}))
    (plain,) = await rotated.decode([sealed])
    assert json.loads(plain.data) == "x"
    wrong = RedactingCodec(Keys(primary="old", by_id={"old": os.urandom(32)}))
    with pytest.raises(CodecError, match="does not decrypt"):
        await wrong.decode([sealed])


def test_search_attributes_carry_identifiers_only():
    """The codec cannot encode search attributes (the server indexes them): every value a workflow sets
    passes ``keyword``, which keeps identifiers and replaces free text."""
    import re

    from runtime import search_attributes as sa

    assert sa.keyword("3f2a9c1e5b7d4a6f8e0c2b4d6f8a0c2e4b6d8f0a") == "3f2a9c1e5b7d4a6f8e0c2b4d6f8a0c2e4b6d8f0a"
    assert sa.keyword("input_error") == "input_error" and sa.keyword("amd64") == "amd64"
    for text in ("push refused: token=s3cret", "a b", "", "x" * 101, "ghp_abc def"):
        assert sa.keyword(text) == sa.UNLISTED
    root = Path(__file__).resolve().parents[2]
    for path in sorted((root / "workflows").glob("*.py")):
        for call in re.findall(r"sa\.\w+\.value_set\(([^()]*(?:\([^()]*\))?[^()]*)\)", path.read_text()):
            assert call.startswith("sa.keyword(") or call.endswith(".value"), (path.name, call)


def test_codec_settings_name_the_key_at_fault(monkeypatch):
    from domain.config import CodecSettings, ConfigError
    from runtime.payload_codec import KEYS_ENV, load_keys

    with pytest.raises(ValueError, match="key: kind 'literal_public' cannot hold a key"):
        CodecSettings.model_validate({"keys": [{"id": "k1", "key": {"kind": "literal_public", "value": "x"}}]})
    with pytest.raises(ValueError, match="duplicate key id k1"):
        CodecSettings.model_validate({"keys": [{"id": "k1", "key": {"kind": "env", "name": "A"}},
                                               {"id": "k1", "key": {"kind": "env", "name": "B"}}]})
    with pytest.raises(ConfigError, match="require_encryption is set but no key"):
        load_keys(CodecSettings(require_encryption=True), env={})
    with pytest.raises(ConfigError, match=f"{KEYS_ENV}: key k1: 5 bytes"):
        load_keys(CodecSettings(), env={KEYS_ENV: "k1=" + base64.b64encode(b"short").decode()})
    with pytest.raises(ConfigError, match=f"{KEYS_ENV}: item 1 is not id=base64key"):
        load_keys(CodecSettings(), env={KEYS_ENV: "nokey"})
    monkeypatch.setenv("CODEC_K1", base64.b64encode(b"k" * 32).decode())
    keys = load_keys(CodecSettings.model_validate({"keys": [{"id": "k1", "key": {"kind": "env", "name": "CODEC_K1"}}]}),
                     env={})
    assert keys.primary == "k1" and keys.by_id["k1"] == b"k" * 32
    two = load_keys(CodecSettings(), env={KEYS_ENV: f"new={base64.b64encode(b'n' * 32).decode()},"
                                                    f"old={base64.b64encode(b'o' * 16).decode()}"})
    assert two.primary == "new" and set(two.by_id) == {"new", "old"}


@contextlib.asynccontextmanager
async def _decode_poster(text: str, **operator_access) -> AsyncIterator:
    """A codec server (``CodecApp`` with no static tokens and ``operator_access``: operators, login_of,
    operator_of) over one payload sealed from ``text``; yields ``post(token)``, a ``/decode`` of that
    payload with ``Authorization: Bearer <token>``. Shared by the operator-access tests."""
    codec = RedactingCodec(Keys(primary="k", by_id={"k": os.urandom(32)}))
    (sealed,) = await codec.encode([pydantic_data_converter.payload_converter.to_payload(text)])
    server = CodecServer(CodecApp(codec, "default", [], **operator_access), "127.0.0.1", 0, [])
    body = {"payloads": [json.loads(MessageToJson(sealed))]}
    try:
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{server.port}", timeout=30) as http:
            def post(token):
                return http.post("/decode", json=body, headers={"Authorization": f"Bearer {token}"})
            yield post
    finally:
        server.close()


async def test_the_codec_server_lets_in_operators_by_their_github_token_only(github_standin):
    """``github_operators``: the token the UI passes is asked ``GET /user`` (the GitHub stand-in); a login
    in operators.logins decodes, another login is 403, an unknown token 401."""
    from runtime.codec_server import github_login_reader

    gh = github_standin
    gh.handle.add_token("tok-alice-0123456789", "alice")
    gh.handle.add_token("tok-mallory-0123456789", "mallory")
    async with _decode_poster("hello", operators={"Alice"}, login_of=github_login_reader(gh.api_url)) as post:
        ok = await post("tok-alice-0123456789")
        assert ok.status_code == 200, ok.text
        assert json.loads(base64.b64decode(ok.json()["payloads"][0]["data"])) == "hello"
        other = await post("tok-mallory-0123456789")
        assert other.status_code == 403 and "mallory is not an operator" in other.text
        assert (await post("tok-nobody-0123456789")).status_code == 401


async def test_the_codec_server_lets_in_members_of_operator_teams_as_approve_merge_does(github_standin):
    """``operators.teams``: a login that is not listed but is an active member of an operator team decodes
    (membership read through the GitHub stand-in by the approval path's own check, worker.py's wiring);
    a login in no operator team is 403. The old server knew operators.logins only and refused the member."""
    from domain.config import OperatorSettings
    from runtime.codec_server import github_login_reader, operator_checker

    gh = github_standin
    gh.handle.set_team("acme/release", ["Carol"])
    gh.handle.set_team("acme/other", ["mallory"])
    gh.handle.add_token("tok-carol-0123456789", "carol")
    gh.handle.add_token("tok-mallory-0123456789", "mallory")
    gh.handle.add_token("tok-alice-0123456789", "alice")
    ops = OperatorSettings(logins=["alice"], teams=["acme/release"])
    reads = []

    def github():  # worker.py passes ``lambda: github_client(config)``: a client of the configured GitHub
        reads.append(1)
        return gh.client()

    async with _decode_poster("hello team", operators=ops, login_of=github_login_reader(gh.api_url),
                              operator_of=operator_checker(ops, github)) as post:
        member = await post("tok-carol-0123456789")
        assert member.status_code == 200, member.text
        assert json.loads(base64.b64decode(member.json()["payloads"][0]["data"])) == "hello team"
        assert (await post("tok-alice-0123456789")).status_code == 200  # by login: no membership read
        other = await post("tok-mallory-0123456789")
        assert other.status_code == 403 and "mallory is not an operator" in other.text, other.text
        assert len(reads) == 2  # carol and mallory, once each
        assert (await post("tok-carol-0123456789")).status_code == 200 and len(reads) == 2  # cached


async def test_the_starter_shows_a_retried_steps_encoded_failure_message():
    """Failure messages travel encoded (``Encoded failure`` in the raw proto): ``decode_failures`` gives the
    starter the real one, redacted, through the client's converter and codec."""
    from types import SimpleNamespace

    from temporalio.api.workflow.v1 import PendingActivityInfo

    from runtime import progress

    secret = "s3ntinel-RETRY-" + os.urandom(8).hex()
    register_secret(secret)
    converter = data_converter(RedactingCodec(Keys(primary="k", by_id={"k": os.urandom(32)})))
    pa = PendingActivityInfo(attempt=3)
    pa.activity_type.name = "submit_job"
    await converter.encode_failure(ApplicationError(f"cannot reach controller ({secret})"), pa.last_failure)
    assert pa.last_failure.message == "Encoded failure"
    (decoded,) = await progress.decode_failures(SimpleNamespace(data_converter=converter), [pa])
    (reason,) = progress.retrying([decoded], "amd64-standard")
    assert "submit_job failed (attempt 2): cannot reach controller ([REDACTED])" in reason.detail, reason.detail
    assert secret not in reason.detail
