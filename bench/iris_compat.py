"""Check an Iris controller against what this service's client needs, before trusting a build to it.

Read-only by default: ``/health``, every ControllerService RPC the client calls (probed with unknown
ids, so nothing is changed), FetchLogs behind the log-server proxy (and whether the old top-level path
still answers). With ``--launch`` it also submits two tiny CPU jobs under ``--user`` (a few seconds
each, then finished; nothing else is touched):

- logs: 5 000 lines then a final marker, exiting at once; the client's complete read
  (``read_complete_log``) must hold the marker; the table says whether a single read at the terminal
  state would have missed it and how long the log took to stop growing;
- retries: ``--max-retries 1`` as ``iris job run`` sends it (``maxRetriesFailure`` + ``maxTaskFailures``),
  failing on attempt 0 (``IRIS_TASK_ID`` ends in ``:0``): Iris must retry it to SUCCEEDED;
- the freshness gate: both launches carry this client's ``client_revision_date`` (clients/iris_pin.py).

``--sandbox`` starts the local sandbox controller (sandbox/iris_controller.py) and checks that one.
Prints a Markdown table; exit status 1 when a check fails.

Run: .venv/bin/python bench/iris_compat.py --controller-url URL [--token-env VAR] [--launch] [--user U]
     .venv/bin/python bench/iris_compat.py --sandbox --launch
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import tempfile
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from clients.iris import (  # noqa: E402
    CONTROLLER_SERVICE,
    LOG_SERVER_PROXY_PREFIX,
    LOG_SERVICE,
    IrisClient,
    JobState,
    LaunchSpec,
    Resources,
)
from clients.iris_pin import IRIS_REVISION_DATE, IRIS_VERSION  # noqa: E402

MARKER = "IRIS-COMPAT-FINAL-MARKER"


@dataclass
class Row:
    check: str
    expected: str
    observed: str
    ok: bool | None  # None: information only


async def _probe(http: httpx.AsyncClient, path: str, body: dict) -> tuple[int, str]:
    try:
        r = await http.post(path, json=body)
    except httpx.HTTPError as e:
        return 0, type(e).__name__
    try:
        code = r.json().get("code") or "ok"
    except ValueError:
        code = (r.text or "").strip()[:40] or "-"
    return r.status_code, code


async def read_only_checks(url: str, token: str | None) -> list[Row]:
    rows: list[Row] = []
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    async with httpx.AsyncClient(base_url=url.rstrip("/"), headers=headers, timeout=20) as http:
        try:
            h = await http.get("/health")
            status = h.json().get("status") if h.status_code == 200 else None
            rows.append(Row("GET /health", "200 status ok", f"{h.status_code} status {status or '-'}",
                            status == "ok"))
        except (httpx.HTTPError, ValueError) as e:
            rows.append(Row("GET /health", "200 status ok", type(e).__name__, False))
            return rows
        missing = "/gpu-rl-builder/iris-compat-no-such-job"
        probes = [  # (rpc, body, accepted (status, code))
            ("ListJobs", {"query": {"limit": 1}}, {(200, "ok")}),
            ("GetJobState", {"jobIds": [missing]}, {(200, "ok")}),
            ("GetJobStatus", {"jobId": missing}, {(404, "not_found")}),
            ("ListTasks", {"jobId": missing}, {(200, "ok")}),
            ("GetTaskStatus", {"taskId": f"{missing}/0"}, {(404, "not_found")}),
            ("TerminateJob", {"jobId": missing}, {(404, "not_found")}),
            ("ListWorkers", {"query": {}}, {(200, "ok")}),
        ]
        for rpc, body, accepted in probes:
            status, code = await _probe(http, f"/{CONTROLLER_SERVICE}/{rpc}", body)
            want = " or ".join(f"{s} {c}" for s, c in sorted(accepted))
            rows.append(Row(f"{rpc}", want, f"{status} {code}", (status, code) in accepted))
        body = {"source": f"{missing}/", "matchScope": "MATCH_SCOPE_PREFIX", "maxLines": 1}
        status, code = await _probe(http, f"{LOG_SERVER_PROXY_PREFIX}/{LOG_SERVICE}/FetchLogs", body)
        rows.append(Row(f"FetchLogs at {LOG_SERVER_PROXY_PREFIX}", "200 ok", f"{status} {code}",
                        (status, code) == (200, "ok")))
        status, code = await _probe(http, f"/{LOG_SERVICE}/FetchLogs", body)
        rows.append(Row("FetchLogs at the old top-level path", "404 on >= 0.2.227 (not used)",
                        f"{status} {code}", None))
    return rows


async def _wait_terminal(iris: IrisClient, job_id: str, timeout_s: float) -> JobState:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        state = (await iris.job_states([job_id])).get(job_id)
        if state and state.is_terminal:
            return state
        await asyncio.sleep(0.1)
    return JobState.UNSPECIFIED


async def launch_checks(url: str, token: str | None, user: str, task_image: str | None,
                        timeout_s: float) -> list[Row]:
    rows: list[Row] = []
    tag = uuid.uuid4().hex[:8]
    small = Resources(cpu_millicores=100, memory_bytes=128 * 2**20, disk_bytes=256 * 2**20)
    async with IrisClient(url, token=token, cluster_name="checked") as iris:
        logs_job = f"/{user}/iris-compat-logs-{tag}"
        try:
            await iris.launch_job(LaunchSpec(name=logs_job, argv=["bash", "-c", f"seq 1 5000; echo {MARKER}"],
                                             resources=small, task_image=task_image))
        except Exception as e:  # noqa: BLE001 - every refusal is a row, e.g. the freshness gate
            rows.append(Row("LaunchJob (freshness gate)", f"accepts client_revision_date {IRIS_REVISION_DATE}",
                            f"{type(e).__name__}: {str(e)[:160]}", False))
            return rows
        rows.append(Row("LaunchJob (freshness gate)", f"accepts client_revision_date {IRIS_REVISION_DATE}",
                        "accepted", True))
        state = await _wait_terminal(iris, logs_job, timeout_s)
        first = await iris.fetch_logs(f"{logs_job}/", tail=True, max_lines=1)
        late = not (first.lines and first.lines[-1] == MARKER)
        log = await iris.read_complete_log(f"{logs_job}/")
        rows.append(Row("log job", "succeeded", state.value, state is JobState.SUCCEEDED))
        rows.append(Row("complete log read (2 flush intervals quiet)", f"5001 lines, last {MARKER}",
                        f"{len(log.entries)} lines, complete={log.complete}, {log.reads} reads, "
                        f"{log.waited_s:.1f} s", log.complete and log.lines[-1:] == [MARKER]))
        rows.append(Row("single read at terminal", "(information)",
                        "missed the final line (lagged)" if late else "had the final line", None))

        retry_job = f"/{user}/iris-compat-retry-{tag}"
        script = 'case "$IRIS_TASK_ID" in *:0) echo first-attempt-fails; exit 1;; esac; echo retried-ok'
        await iris.launch_job(LaunchSpec(name=retry_job, argv=["bash", "-c", script], resources=small,
                                         max_retries_failure=1, task_image=task_image))
        echoed = (await iris._call("GetJobStatus", {"jobId": retry_job})).get("request") or {}  # noqa: SLF001
        sent = (echoed.get("maxRetriesFailure", 0), echoed.get("maxTaskFailures", 0))
        rows.append(Row("--max-retries 1 read back", "maxRetriesFailure=1, maxTaskFailures=1",
                        f"maxRetriesFailure={sent[0]}, maxTaskFailures={sent[1]}", sent == (1, 1)))
        state = await _wait_terminal(iris, retry_job, timeout_s)
        attempts = (await iris.task_status(f"{retry_job}/0")).attempts
        seen = ", ".join(a.state.value for a in attempts)
        rows.append(Row("fails once, retried by Iris", "succeeded; attempts failed, succeeded",
                        f"{state.value}; attempts {seen}",
                        state is JobState.SUCCEEDED and [a.state.value for a in attempts] == ["failed", "succeeded"]))
    return rows


def table(url: str, rows: list[Row]) -> str:
    out = [f"Iris compatibility of {url} (client built against marin-iris {IRIS_VERSION}, "
           f"client_revision_date {IRIS_REVISION_DATE})", "",
           "| check | expected | observed | verdict |", "|---|---|---|---|"]
    for r in rows:
        verdict = "info" if r.ok is None else ("ok" if r.ok else "FAIL")
        out.append(f"| {r.check} | {r.expected} | {r.observed} | {verdict} |")
    return "\n".join(out)


async def run(args) -> int:
    token = os.environ.get(args.token_env) if args.token_env else None
    handle = None
    url = args.controller_url
    if args.sandbox:
        from sandbox.iris_controller import start_iris_controller

        handle = start_iris_controller(Path(tempfile.mkdtemp(prefix="iris-compat-")))
        url = handle.url
    try:
        rows = await read_only_checks(url, token)
        if args.launch and all(r.ok is not False for r in rows[:1]):
            rows += await launch_checks(url, token, args.user, args.task_image, args.timeout)
    finally:
        if handle:
            handle.stop()
    print(table("the sandbox controller" if args.sandbox else url, rows))
    return 1 if any(r.ok is False for r in rows) else 0


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    where = p.add_mutually_exclusive_group(required=True)
    where.add_argument("--controller-url", help="the controller (e.g. a kubectl port-forward URL)")
    where.add_argument("--sandbox", action="store_true", help="start and check the local sandbox controller")
    where.add_argument("--smoke", action="store_true", help="the smallest run that still prints every table, in seconds (tests/bench/test_bench_smoke.py): --sandbox")
    p.add_argument("--token-env", help="environment variable holding a bearer token for the controller")
    p.add_argument("--launch", action="store_true", help="also submit two tiny CPU jobs (logs, retries)")
    p.add_argument("--user", default="gpu-rl-builder", help="job owner for --launch (default gpu-rl-builder)")
    p.add_argument("--task-image", help="task image for --launch jobs (default: the cluster's)")
    p.add_argument("--timeout", type=float, default=300.0, help="bound on each --launch job (s)")
    args = p.parse_args()
    args.sandbox = args.sandbox or args.smoke
    sys.exit(asyncio.run(run(args)))


if __name__ == "__main__":
    main()
