#!/usr/bin/env python3
"""Redaction throughput and coverage: ``domain.redact`` on the texts it meets, with five credentials and a
GitHub App key (its 26 base64 lines registered one by one, as clients/github_app.py does) registered.

Prints two Markdown tables: time per call and MB/s for each workload (best of ``--rounds``), and for every
encoding of tests/sentinel_forms.py how many of the five credentials still leak a needle (in JSON: in
the redacted document and in its decoded strings). ``--before DIR`` also loads ``domain/redact.py`` of
another checkout (e.g. a worktree at the previous commit) and times both round by round, interleaved, so a
load spike on a shared machine hits both. Asserts nothing.

    .venv/bin/python bench/redaction.py [--before DIR] [--rounds 5] [--cpu]

``--cpu`` times by the process's CPU time instead of the wall clock: on a shared machine under load it
stays close to an idle machine's wall time, where the wall clock counts the time other processes ran.
"""

from __future__ import annotations

import argparse
import base64
import importlib.util
import json
import os
import random
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

CREDENTIALS = {
    "registry.token": "s3nt1nel+Reg/is~??>?>try=Tok3n-ABCDEFGH~xyz",
    "github.token": "ghp_" + "S3ntinelGitHubT0kenAbCdEfGhIjKlMn0pQ",  # a sentinel, split so no scanner takes it for a token
    "github.webhook.secret": "5e471e1-webhook-secret-0f9a8b7c6d5e4f3a2b1c",
    "temporal.api_key": "eyJhbGciOiJFUzI1NiJ9.eyJzdWIiOiJzZW50aW5lbCJ9.S3nt+nel/Sig_naturE-0123456789",
    "clusters.iris.token": "iris_s3ntinel?token&with=url/chars+7",
}


def _rss_kib() -> int:
    return int(Path("/proc/self/statm").read_text().split()[1]) * os.sysconf("SC_PAGE_SIZE") // 1024


def _pem(rng: random.Random) -> str:
    body = base64.b64encode(rng.randbytes(1190)).decode()
    lines = [body[i:i + 64] for i in range(0, len(body), 64)]
    return "-----BEGIN RSA PRIVATE KEY-----\n" + "\n".join(lines) + "\n-----END RSA PRIVATE KEY-----\n"


def _workloads(rng: random.Random, leak_forms: list[str]) -> dict[str, object]:
    words = ["Step", "RUN", "pip", "install", "--no-cache-dir", "torch==2.5.1", "100%", "|", "█████", "sha256:",
             "https://pypi.org/simple/", "a%20b", "Downloading", "layer", "0x7f", "\\n", "{\"k\": \"v\"}", "=>"]

    def line(i: int) -> str:
        return f"[amd64-standard/0 {'stderr' if i % 3 else 'stdout'}] " + " ".join(rng.choice(words) for _ in range(12))

    log = "\n".join(line(i) for i in range(12_000))
    leaky = log.splitlines()
    for k, form in enumerate(leak_forms):
        leaky[(k * 397) % len(leaky)] += " " + form
    payload = json.dumps({"events": [{"kind": "progress", "line": line(i), "n": i, "url": "https://x/a%2Fb"}
                                     for i in range(260)]})
    heartbeat = {"state": "running", "markers": [line(i) for i in range(40)], "job": {"id": "j", "tasks": [
        {"task_id": f"t{i}", "error": line(i)} for i in range(10)]}}
    blob = base64.encodebytes(rng.randbytes(700_000)).decode()  # a dump's or a manifest's wrapped base64
    return {
        "log line, 120 chars": line(0)[:120],
        "log line with a raw token": line(1)[:90] + " " + CREDENTIALS["registry.token"],
        "activity payload, 36 KB JSON": payload,
        "heartbeat dict (redact_obj), 50 strings": heartbeat,
        "build log 1 MB, no secret": log,
        "build log 1 MB, 30 leaks in mixed forms": "\n".join(leaky),
        "base64 blob 0.9 MB wrapped at 76 columns": blob,
    }


def _load(path: Path, name: str):
    """``domain/redact.py`` of a checkout as its own module (it imports nothing from the project)."""
    spec = importlib.util.spec_from_file_location(name, path / "domain" / "redact.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _register(r, pem: str) -> float:
    t0 = time.perf_counter()
    for value in CREDENTIALS.values():
        r.register_secret(value)
    r.register_secret(pem)
    for pem_line in pem.splitlines():
        if len(pem_line) >= 16 and not pem_line.startswith("-----"):
            r.register_secret(pem_line)
    r.redact("the automaton is built at the first redact after a registration")
    return time.perf_counter() - t0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--before", type=Path, help="a checkout whose domain/redact.py is compared, round by round")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--cpu", action="store_true", help="time by process CPU time (time.process_time), not wall time")
    ap.add_argument("--smoke", action="store_true", help="the smallest run that still prints every table, in seconds (tests/bench/test_bench_smoke.py)")
    args = ap.parse_args()
    if args.smoke:
        args.rounds = 1
    sys.path.insert(0, str(ROOT))
    from tests.sentinel_forms import forms, needles  # noqa: E402

    impls = {"now": _load(ROOT, "redact_now")}
    if args.before:
        impls = {"before": _load(args.before.resolve(), "redact_before"), **impls}
    rng = random.Random(27)
    pem = _pem(rng)
    clock = time.process_time if args.cpu else time.perf_counter
    print(f"load average {os.getloadavg()[0]:.2f}; {len(CREDENTIALS)} credentials and a GitHub App key (26 lines) "
          f"registered; timed by {'process CPU time' if args.cpu else 'wall clock'}")
    for name, r in impls.items():
        rss0 = _rss_kib()
        took = _register(r, pem)
        print(f"- {name}: {len(r.registered_secrets())} secrets registered and ready in {took * 1000:.0f} ms, "
              f"RSS +{_rss_kib() - rss0} KiB")

    all_forms = {(k, n): f for k, v in CREDENTIALS.items() for n, f in forms(v).items()}
    mixed = [all_forms[key] for key in rng.sample(sorted(all_forms), 30)]
    names = list(impls)
    print("\n| workload | size | " + " | ".join(f"{n} µs/call | {n} MB/s" for n in names)
          + (" | speed-up |" if len(names) == 2 else " |"))
    print("|---|---:|" + "---:|---:|" * len(names) + ("---:|" if len(names) == 2 else ""))
    for workload, data in _workloads(rng, mixed).items():
        size = len(json.dumps(data)) if isinstance(data, dict) else len(data)
        calls = max(1, 200_000 // size)
        best = dict.fromkeys(names, float("inf"))
        for _ in range(args.rounds):  # interleaved, so a load spike on this shared machine hits both
            for n in names:
                fn = impls[n].redact_obj if isinstance(data, dict) else impls[n].redact
                t = clock()
                for _ in range(calls):
                    fn(data)
                best[n] = min(best[n], (clock() - t) / calls)
        cells = " | ".join(f"{best[n] * 1e6:,.1f} | {size / best[n] / 1e6:,.1f}" for n in names)
        ratio = f" | {best[names[0]] / best[names[1]]:.1f}×" if len(names) == 2 else ""
        print(f"| {workload} | {size:,} | {cells}{ratio} |")

    print("\n| encoding | " + " | ".join(f"{n}: credentials (of 5) leaking as printed / in JSON / line by line"
                                         for n in names) + " |")
    print("|---|" + "---|" * len(names))
    for form in sorted(forms("x" * 16)):
        cells = []
        for n in names:
            r = impls[n]
            counts = [0, 0, 0]
            for value in CREDENTIALS.values():
                printed, ns = forms(value)[form], needles(value)[form]
                text = f"leak: {printed} end"
                doc = r.redact(json.dumps({"log": text}))
                try:
                    inner = json.loads(doc)["log"]
                except ValueError:  # a redactor that cut an escape in half: the document is the sink
                    inner = ""
                outs = [r.redact(text), doc + "\n" + inner,
                        "\n".join(r.redact(x) for x in text.splitlines())]
                for i, out in enumerate(outs):
                    counts[i] += any(x in out for x in ns)
            cells.append(" / ".join(map(str, counts)))
        print(f"| {form} | {' | '.join(cells)} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
