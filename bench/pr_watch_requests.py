"""Benchmark: GitHub requests per hour of the PR watch on an idle PR, before and after conditional requests.

The real ``watch_pull_request`` activity (``RecordActivities``, default cadence: ``merge_watch_interval_s``
and, while an authorization waits for green, ``merge_watch_authorized_interval_s``) watches one open PR
on a GitHub stand-in of its own, in-process, for ``--seconds``; nothing changes on the PR meanwhile (CI
running). The stand-in answers as GitHub does (weak ETag, 304 on If-None-Match) and counts the answers
charged to the primary rate limit (everything but a 304) apart from the 304s. *before*: the client without
the conditional cache (every read a full request, as before this change); *after*: the worker's cache.

Per mode the watch first runs once to see the PR (the cold round, not counted: in production it happens
once per worker start), then a second watch (a new activity run, as the workflow starts after every
change) runs for the window; the rates are the window's counts scaled to an hour. Then CI turns green:
the requests of the round that sees it are printed too (a change is still seen on the next round).

Prints a Markdown table; asserts nothing.
Run: .venv/bin/python bench/pr_watch_requests.py [--seconds 300]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import git  # noqa: E402
from temporalio.testing import ActivityEnvironment  # noqa: E402

from activities.record import RecordActivities  # noqa: E402
from clients.github import GitHubClient  # noqa: E402
from domain.config import ServiceConfig  # noqa: E402
from domain.models import WatchInput  # noqa: E402
from sandbox.github_standin import start_github_standin  # noqa: E402

REPO = "acme/widgets"
TOKEN_ENV = "BENCH_PR_WATCH_GH_TOKEN"


def _bare_repo(root: Path) -> Path:
    root.mkdir(parents=True)
    bare = root / "widgets.git"
    git.Repo.init(bare, bare=True, initial_branch="main")
    work = git.Repo.clone_from(bare, root / "work")
    with work.config_writer() as cw:
        cw.set_value("user", "name", "Bench")
        cw.set_value("user", "email", "bench@example.invalid")
    wd = Path(work.working_dir)
    work.git.checkout("-b", "main")
    (wd / "pins.txt").write_text("pin=old\n")
    work.git.add("pins.txt")
    work.git.commit("-m", "initial")
    work.git.checkout("-b", "feature")
    (wd / "pins.txt").write_text("pin=new\n")
    work.git.commit("-am", "bump pin")
    work.git.push("origin", "main", "feature")
    return bare


def _config(root: Path, api_url: str, token_env: str) -> ServiceConfig:
    return ServiceConfig.model_validate({
        "work_dir": str(root / "work-dir"),
        "repos": {"marinskyrl_url": "file:///x", "harbor_url": "file:///y", "marinskyrl_slug": REPO},
        "clusters": {},
        "registry": {"image_repository": "127.0.0.1:5000/gpu-rl", "user": {"kind": "literal_public", "value": "u"},
                     "token": {"kind": "env", "name": token_env}},
        "github": {"api_url": api_url, "token": {"kind": "env", "name": token_env}, "required_checks": ["ci"]},
        "operators": {"logins": ["bench-operator"]},
    })


async def _mode(root: Path, *, conditional: bool, authorized: bool, seconds: float) -> dict:
    bare = _bare_repo(root)
    h = start_github_standin(root / "gh-state", {REPO: str(bare)})
    try:
        token_env = f"{TOKEN_ENV}_{root.name}"  # each mode has its own stand-in, with its own token
        os.environ[token_env] = h.token
        async with GitHubClient(h.api_url, h.token, REPO) as gh:
            pull = await gh.ensure_pull("feature", "main", "bench", "idle PR watch benchmark")
        sha = git.Repo(bare).commit("refs/heads/feature").hexsha
        h.set_check(REPO, sha, "ci", status="in_progress", conclusion=None)  # CI running: the PR is idle
        config = _config(root, h.api_url, token_env)
        acts = RecordActivities(config)
        if not conditional:
            acts.github_cache = None  # the client as before: no validators, every read a full answer
        every = (config.policy.merge_watch_authorized_interval_s if authorized
                 else config.policy.merge_watch_interval_s)
        env = ActivityEnvironment()
        first = await env.run(acts.watch_pull_request, WatchInput(pr_number=pull.number, authorized=authorized))
        h.request_stats(reset=True)
        state = await env.run(acts.watch_pull_request, WatchInput(
            pr_number=pull.number, last=first, return_after_s=seconds, authorized=authorized))
        idle = h.request_stats(reset=True)
        assert state == first, "the PR changed during the idle window"
        h.set_check(REPO, sha, "ci")  # CI turns green: the next round must see it
        green = await env.run(acts.watch_pull_request, WatchInput(
            pr_number=pull.number, last=first, return_after_s=seconds, authorized=authorized))
        change = h.request_stats(reset=True)
        return {"every": every, "idle": idle, "change": change, "seen": green.checks == "success"}
    finally:
        h.stop()


async def main(seconds: float) -> None:
    with tempfile.TemporaryDirectory(prefix="bench-pr-watch-") as tmp:
        modes = [(c, a) for a in (False, True) for c in (False, True)]
        results = await asyncio.gather(*(
            _mode(Path(tmp) / f"m{i}", conditional=c, authorized=a, seconds=seconds) for i, (c, a) in enumerate(modes)))
    scale = 3600.0 / seconds
    print(f"idle window {seconds:g} s per mode, scaled to an hour; one open PR, CI running\n")
    print("| watch | cadence | client | requests/h | charged to the rate limit (non-304)/h | 304/h "
          "| round that sees CI turn green: charged + 304 |")
    print("|---|---:|---|---:|---:|---:|---|")
    for (conditional, authorized), r in zip(modes, results, strict=True):
        idle, change = r["idle"], r["change"]
        print(f"| {'authorized, waiting for green' if authorized else 'idle PR'} | {r['every']:g} s "
              f"| {'after: conditional (ETag)' if conditional else 'before: plain GET'} "
              f"| {idle['requests'] * scale:,.0f} | {idle['counted'] * scale:,.0f} | {idle['not_modified'] * scale:,.0f} "
              f"| {change['counted']} + {change['not_modified']}{'' if r['seen'] else ' (NOT seen)'} |")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=300.0)
    parser.add_argument("--smoke", action="store_true", help="the smallest run that still prints every table, in seconds (tests/bench/test_bench_smoke.py)")
    args = parser.parse_args()
    asyncio.run(main(6.0 if args.smoke else args.seconds))
