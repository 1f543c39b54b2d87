"""Run the main job end to end on the local sandbox: the README's first command.

Starts the stack of real services, a worker process, and drives ``starter.py`` exactly as an operator
would: ``build`` (amd64/standard by default), then plays the two human roles the runbook keeps for
people — making the package public when the anonymous-pull gate asks for it, and (after the sandbox
"CI" reports green) authorizing the merge. Prints the report, checks the digest against the registry
with ``skopeo``, then stops every process it started (unless ``--keep``).
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import click

from domain.models import target_workflow_id
from workflows.target import TargetBuildWorkflow

ROOT = Path(__file__).resolve().parents[1]
PY = sys.executable


def _starter(config: Path, *args: str, check: bool = True) -> subprocess.CompletedProcess:
    return subprocess.run([PY, str(ROOT / "starter.py"), "--config", str(config), *args], cwd=ROOT,
                          capture_output=True, text=True, check=check, timeout=600)


def _query(config: Path, wid: str) -> dict:
    out = _starter(config, "report", wid, "--format", "json", check=False)
    # A failed build's report exits 1 (2 for refused input) and still prints its JSON on stdout.
    return json.loads(out.stdout) if out.stdout.lstrip().startswith("{") else {}


def _target_status(stack, wid: str, key: str) -> dict:
    """A target's status as the Temporal UI/CLI shows it (the child workflow's ``status`` query)."""
    return asyncio.run(_query_child(stack.temporal.address, target_workflow_id(wid, key)))


async def _query_child(address: str, child_id: str) -> dict:
    from temporalio.client import Client
    from temporalio.contrib.pydantic import pydantic_data_converter


    client = await Client.connect(address, data_converter=pydantic_data_converter)
    try:
        st = await client.get_workflow_handle(child_id).query(TargetBuildWorkflow.status)
        return st.model_dump(mode="json")
    except Exception:  # noqa: BLE001 - not started yet
        return {}


def _until_worker_polls(config: Path, worker: subprocess.Popen, log: Path, timeout_s: float = 120.0) -> None:
    """Wait (bounded) until the worker polls its task queue, as an operator waits for "worker started"."""
    from domain.config import load_config

    settings = load_config(config).temporal
    deadline = time.monotonic() + timeout_s
    while not asyncio.run(_polled(settings.address, settings.namespace, settings.task_queue)):
        if worker.poll() is not None or time.monotonic() > deadline:
            tail = log.read_text(errors="replace").strip().splitlines()[-5:] if log.exists() else []
            why = f"exited with {worker.returncode}" if worker.returncode is not None else f"not polling after {timeout_s:.0f}s"
            raise click.ClickException(f"the worker {why}; {log}:\n" + "\n".join(tail))
        time.sleep(0.5)


async def _polled(address: str, namespace: str, task_queue: str) -> bool:
    from temporalio.client import Client

    from runtime.operator_client import has_workers

    return await has_workers(await Client.connect(address, namespace=namespace), task_queue)


async def _running(address: str, wid: str) -> bool:
    from temporalio.client import Client, WorkflowExecutionStatus

    client = await Client.connect(address)
    return (await client.get_workflow_handle(wid).describe()).status == WorkflowExecutionStatus.RUNNING


def skopeo_digest(host: str, ref: str, user: str, token: str) -> str | None:
    """sha256 of the raw manifest as skopeo (an independent client) fetches it; None if it cannot."""
    with tempfile.NamedTemporaryFile("w", suffix=".json") as auth:
        import base64

        auth.write(json.dumps({"auths": {host: {"auth": base64.b64encode(f"{user}:{token}".encode()).decode()}}}))
        auth.flush()
        out = subprocess.run(["skopeo", "inspect", "--raw", "--tls-verify=false", "--authfile", auth.name,
                              f"docker://{ref}"], capture_output=True, timeout=120)
    return "sha256:" + hashlib.sha256(out.stdout).hexdigest() if out.returncode == 0 else None


def _size_mb(path: Path) -> float:
    total = 0
    for root, _dirs, files in os.walk(path):
        for name in files:
            try:
                total += os.lstat(os.path.join(root, name)).st_size
            except OSError:
                pass
    return total / 1e6


OPERATOR = "sandbox-operator"  # one of sandbox.stack.SANDBOX_OPERATORS (operators.logins of the sandbox config)


def next_lines(config: Path) -> list[str]:
    """What a newcomer needs from the kept stack, from a second terminal: the export line, the --cluster flags
    (the sandbox's clusters are not the ops doc's) and the operator login --by takes (README: "Your first
    build on the sandbox")."""
    clusters = " ".join(f"--cluster {a}=sandbox-{a}" for a in ("amd64", "arm64"))  # sandbox.stack's clusters
    return ["your own build, from a second terminal:",
            # PATH: `python starter.py …` (the README's lines, every printed next step) is the project's venv, from
            # the checkout a second terminal stands in; a fresh machine's own python lacks the service's packages.
            f'  export GPU_RL_BUILDER_CONFIG={config} GPU_RL_BUILDER_OPERATOR={OPERATOR} PATH="$PWD/.venv/bin:$PATH"',
            f"  cluster flags for build: {clusters}",
            f"  operator login for --by: {OPERATOR} (printed commands use $GPU_RL_BUILDER_OPERATOR for --by)"]


def state_note(state_dir: Path, clean: bool) -> str:
    """After the stack stopped: remove its state (``--clean``), or say where it is, how big, and how to
    remove it (each run leaves tens of MB: the Temporal database, the registries' blobs, the git remotes)."""
    if clean:
        shutil.rmtree(state_dir, ignore_errors=True)
        return f"sandbox state {state_dir} removed (--clean)"
    if not state_dir.exists():
        return f"sandbox state {state_dir}: nothing left"
    return (f"sandbox state left in {state_dir} ({_size_mb(state_dir):.0f} MB: logs, Temporal database, "
            f"registries, git remotes); remove it with `rm -rf {state_dir}`, or pass --clean next time")


class _Stopped(KeyboardInterrupt):
    """SIGTERM/SIGHUP, raised where the demo is (like Ctrl-C's KeyboardInterrupt) so the same cleanup runs."""

    def __init__(self, signum: int):
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


def _raise_stopped(signum, _frame) -> None:
    raise _Stopped(signum)


def _stop_like_ctrl_c() -> None:
    """Why: by default SIGTERM (``kill``, a CI timeout, a closing terminal's SIGHUP) ends Python at once,
    skipping every ``finally``: the worker and the four services of the stack would be left running."""
    for sig in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, _raise_stopped)


def _no_interruptions() -> None:
    """While stopping: a second Ctrl-C or SIGTERM must not cut the cleanup short."""
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, signal.SIG_IGN)


@click.command()
@click.option("--state-dir", type=click.Path(path_type=Path), default=None,
              help="Where the stack keeps its state (default: a fresh temporary directory).")
@click.option("--arch", "archs", multiple=True, default=("amd64",), show_default=True)
@click.option("--variant", "variants", multiple=True, default=("standard",), show_default=True)
@click.option("--keep", is_flag=True, help="Leave the stack and worker running until Ctrl-C or SIGTERM.")
@click.option("--timeout", default=900, show_default=True, help="Give up after this many seconds.")
@click.option("--clean", is_flag=True, help="Remove the state directory once everything stopped (default: keep "
                                            "it for inspection and print where it is).")
def main(state_dir, archs, variants, keep, timeout, clean):
    from sandbox.stack import IMAGE_REPO_PATH, SandboxStack

    _stop_like_ctrl_c()
    state_dir = state_dir or Path(tempfile.mkdtemp(prefix="gpu-rl-sandbox-"))
    click.echo(f"sandbox state: {state_dir}")
    worker = None
    code = 1
    try:
        # CI reports green by itself on every pushed head (the GitHub stand-in's auto-green), as a real
        # repository's would: the kept stack merges an operator's own build without a stand-in admin call.
        stack = SandboxStack(state_dir, auto_green=True).start()  # stops what it started if interrupted half-way
    except KeyboardInterrupt as e:
        click.echo(f"interrupted ({e}) while starting the stack; sandbox stopped", err=True)
        click.echo(state_note(state_dir, clean), err=True)
        sys.exit(128 + getattr(e, "signum", signal.SIGINT))
    try:
        config = stack.config_path
        click.echo(f"Temporal UI: {stack.temporal.ui_url}")
        worker = subprocess.Popen([PY, str(ROOT / "worker.py"), "--config", str(config)], cwd=ROOT,
                                  start_new_session=True, stdout=open(state_dir / "worker.log", "w"),
                                  stderr=subprocess.STDOUT)
        _until_worker_polls(config, worker, state_dir / "worker.log")  # `build` refuses a queue nobody serves
        clusters = [f"--cluster={a}=sandbox-{a}" for a in archs]
        args = ["build", *[f"--arch={a}" for a in archs], *[f"--variant={v}" for v in variants], *clusters,
                "--requested-by", "sandbox-demo", "--reason", "end-to-end sandbox run of the runbook",
                "--link", "https://github.com/marin-community/marin/issues/7920"]
        out = _starter(config, *args)
        click.echo(out.stdout.strip())
        wid = out.stdout.split()[1]
        deadline = time.monotonic() + timeout
        last_line = ""
        keys = [f"{a}-{v}" for a in archs for v in variants]
        rechecked: set[str] = set()
        while time.monotonic() < deadline:
            rep = _query(config, wid)
            status = rep.get("status")
            statuses = {k: _target_status(stack, wid, k) for k in keys}
            line = " | ".join(f"{k}: {s.get('stage', '-')}" + (f" ({s['progress']['state']})" if s.get("progress") else "")
                              for k, s in statuses.items())
            if line != last_line:
                click.echo(f"[{time.strftime('%H:%M:%S')}] {line}")
                last_line = line
            for k, s in statuses.items():
                waiting = s.get("waiting") or {}
                if waiting.get("kind") == "package_visibility" and k not in rechecked:
                    if not stack.token_registry.is_public(IMAGE_REPO_PATH):
                        click.echo(f"operator: making {IMAGE_REPO_PATH} public (package settings → visibility)")
                        stack.token_registry.set_public(IMAGE_REPO_PATH, True)
                    click.echo(f"operator: starter.py recheck {wid} {k}")
                    _starter(config, "recheck", wid, k)
                    rechecked.add(k)
            pr = rep.get("pull_request")
            if pr and status == "awaiting_merge":  # CI turns green by itself (auto-green)
                res = _starter(config, "approve-merge", wid, "--by", OPERATOR, check=False)
                if res.returncode == 0:
                    click.echo(f"operator: {res.stdout.strip()}")
            if status == "merged" or not asyncio.run(_running(stack.temporal.address, wid)):
                break
            time.sleep(2)
        final = _starter(config, "report", wid, check=False)
        click.echo(final.stdout)
        rep = _query(config, wid)
        code = 0 if rep.get("status") == "merged" else 1
        for t in rep.get("targets", []):
            ref = f"{t['image_ref']}"
            oracle = skopeo_digest(stack.token_registry.host, ref, stack.token_registry.push_user,
                                    stack.token_registry.push_token)
            agree = "agrees" if oracle == t.get("digest") else "DISAGREES"
            click.echo(f"skopeo: {ref} → {oracle} ({agree} with the report)")
            if oracle != t.get("digest"):
                code = 1
        click.echo(f"Temporal UI: {stack.temporal.ui_url}/namespaces/default/workflows/{wid}")
        if keep:
            click.echo("\n".join(next_lines(config)))
            click.echo("stack is up (--keep); Ctrl-C or SIGTERM to stop everything")
            sys.stdout.flush()
            try:
                signal.pause()
            except KeyboardInterrupt:
                pass
    except KeyboardInterrupt as e:  # Ctrl-C, SIGTERM or SIGHUP before the end: stop everything, say so
        code = 128 + getattr(e, "signum", signal.SIGINT)
        click.echo(f"interrupted ({e or 'SIGINT'}); stopping everything", err=True)
    finally:
        _no_interruptions()
        if worker is not None and worker.poll() is None:
            os.killpg(worker.pid, signal.SIGTERM)
            try:
                worker.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(worker.pid, signal.SIGKILL)
        stack.stop()
        click.echo("sandbox stopped; no process left running")
        click.echo(state_note(state_dir, clean))
    sys.exit(code)


if __name__ == "__main__":
    main()
