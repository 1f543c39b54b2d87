"""Benchmark: how fast a build resumes after its worker is SIGKILLed, per phase.

Starts a SandboxStack, then for each round runs one amd64 build through ``sandbox/kill_matrix.py``: the
worker is SIGKILLed while load, publish, submit, validate, record and merge run, and each time a new
worker with an empty work directory is started at once. Measured: new worker start → the killed step
running again (Temporal's pending-activity state, polled every 0.1 s). Target: ≤ 20 s.

Prints a Markdown table; asserts nothing (the e2e test bounds each resume at 60 s).
Run: .venv/bin/python bench/resume_after_kill.py [--n 1]
"""

from __future__ import annotations

import argparse
import asyncio
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from temporalio.client import Client  # noqa: E402
from temporalio.contrib.pydantic import pydantic_data_converter  # noqa: E402

from bench._stack import add_stack_flag, bench_stack  # noqa: E402
from domain.buildset import BuildRequest, CompatibilityRequest  # noqa: E402
from domain.config import load_config  # noqa: E402
from domain.models import PipelineInput, pipeline_id  # noqa: E402
from sandbox.git_remotes import commit_to_remote  # noqa: E402
from sandbox.kill_matrix import PHASES, KillMatrix, PhaseResult  # noqa: E402
from sandbox.stack import MARINSKYRL_SLUG, SandboxStack  # noqa: E402
from starter import ls_remote_head  # noqa: E402
from workflows.pipeline import BuildPipelineWorkflow  # noqa: E402

TARGET_S = 20.0


async def one_round(i: int, stack: SandboxStack, client: Client, state_dir: Path,
                    phases: tuple = PHASES) -> list[PhaseResult]:
    config = load_config(stack.config_path)
    commit_to_remote(stack.remotes.marinskyrl_url, {"bench/kill.txt": f"kill-matrix round {i} at {time.time()}\n"},
                     f"bench: kill-matrix round {i}")
    stack.token_registry.set_public(stack.image_repo_path, True)  # crashes, not the visibility gate
    src = ls_remote_head(config.repos.marinskyrl_url)
    harbor = ls_remote_head(config.repos.harbor_url)
    wid = pipeline_id(src, harbor)
    req = BuildRequest(architectures=["amd64"], variants=["standard"], clusters={"amd64": "sandbox-amd64"},
                       compatibility_request=CompatibilityRequest(requested_by="bench", reason="kill matrix"),
                       issue_url="https://github.com/marin-community/MarinSkyRL/issues/7")
    handle = await client.start_workflow(
        BuildPipelineWorkflow.run,
        PipelineInput(request=req, request_id=wid, source_commit=src, harbor_commit=harbor),
        id=wid, task_queue=config.temporal.task_queue)
    round_dir = state_dir / f"kill-round-{i}"
    round_dir.mkdir(parents=True, exist_ok=True)
    matrix = KillMatrix(client=client, config_path=stack.config_path, state_dir=round_dir, github=stack.github,
                        repo_slug=MARINSKYRL_SLUG, phases=phases)
    final = await matrix.run(handle)
    print(f"round {i}: {final.status} ({final.message})", file=sys.stderr, flush=True)
    return matrix.results


def print_table(rounds: list[list[PhaseResult]]) -> None:
    print(f"\n## Resume after SIGKILL ({len(rounds)} round(s); new worker started at once, empty work dir)\n")
    print("| phase | activity | new worker start → running again (median / max) | SIGKILL → running again (max) "
          f"| ≤ {TARGET_S:.0f} s |")
    print("|---|---|---|---|---|")
    for phase in PHASES:
        rs = [r for results in rounds for r in results if r.phase == phase.name]
        if not rs:
            continue
        resume = [r.resume_s for r in rs]
        since = max(r.since_kill_s for r in rs)
        ok = "yes" if max(resume) <= TARGET_S else "NO"
        print(f"| {phase.name} | `{phase.activity}` | {statistics.median(resume):.1f} s / {max(resume):.1f} s "
              f"| {since:.1f} s | {ok} |")


async def main_async(args) -> int:
    state_dir = Path(args.state_dir) if args.state_dir else Path(tempfile.mkdtemp(prefix="bench-kill-"))
    stack = bench_stack(args.stack, state_dir, "kill")
    try:
        client = await Client.connect(stack.temporal.address, namespace=stack.temporal.namespace,
                                      data_converter=pydantic_data_converter)
        rounds = []
        for i in range(1, args.n + 1):
            print(f"round {i}/{args.n} …", file=sys.stderr, flush=True)
            rounds.append(await one_round(i, stack, client, state_dir, args.phases))
        print_table(rounds)
        return 0
    finally:
        stack.stop()
        if not args.state_dir:
            shutil.rmtree(state_dir, ignore_errors=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=1, help="rounds (one build each, killed once per phase)")
    ap.add_argument("--state-dir", help="keep the stack's state (and worker logs) here")
    ap.add_argument("--phases", default=",".join(p.name for p in PHASES), help="comma list of the phases to kill in")
    add_stack_flag(ap)
    ap.add_argument("--smoke", action="store_true", help="the smallest run that still prints every table, in seconds (tests/bench/test_bench_smoke.py): one round, the load phase only")
    args = ap.parse_args()
    if args.smoke:
        args.n, args.phases = 1, "load"
    names = [p.strip() for p in args.phases.split(",") if p.strip()]
    if unknown := sorted(set(names) - {p.name for p in PHASES}):
        ap.error(f"--phases: unknown phase(s) {', '.join(unknown)} (known: {', '.join(p.name for p in PHASES)})")
    args.phases = tuple(p for p in PHASES if p.name in names)
    raise SystemExit(asyncio.run(main_async(args)))


if __name__ == "__main__":
    main()
