"""Benches cannot rot (issue 37 item 5): every bench under bench/ runs at its smoke size and prints its
table, and every bench command printed in docs/benchmarks.md (and the bench READMEs) names a script that
exists and flags it accepts.

Why subprocesses, several at once: a bench is run as printed (``.venv/bin/python bench/X.py``), with its
own servers (the four that start a sandbox stack attach to one started here, ``--stack``, bench/_stack.py:
a stack costs about 10 CPU seconds and a minute of a loaded machine); most of the time goes to waiting, so running the smoke runs side by side keeps the
total near the slowest one. One test runs them all (under pytest-xdist a parametrized set would start the
runs once per worker) and names every bench that failed, with the tail of its stderr.
"""

from __future__ import annotations

import contextlib
import os
import re
import resource
import shlex
import signal
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from markdown_it import MarkdownIt

from sandbox.stack import SandboxStack

ROOT = Path(__file__).resolve().parents[2]
BENCH = ROOT / "bench"
# Not benches: processes a bench starts (bench/monitoring.py runs monitor_worker.py as its worker).
HELPERS = {"monitor_worker.py": "the worker process bench/monitoring.py starts (its smoke run covers it)"}
BENCHES = sorted(p.name for p in BENCH.glob("*.py") if p.name not in HELPERS and not p.name.startswith("_"))
SMOKE_TIMEOUT_S = 420.0  # one bench under a loaded machine (2 cores shared); idle they take 1-30 s
PARALLEL = 4
# Smoke seconds measured side by side (4 at once on one shared stack, load 5-10, h/smoke at 4e7a5f4+2): a
# free slot takes the longest bench it may start, so the last one to finish is not a long bench started
# late (238 s wall for 761 s of runs in alphabetical order, 1b849da). A bench not listed is started first
# (its length is unknown). The attaching benches start once the shared stack is up (about a minute).
SMOKE_S = {"rehearsal.py": 52, "monitoring.py": 45, "resume_after_kill.py": 40, "pipeline_e2e.py": 35,
           "end_phase.py": 30, "registry_validation.py": 28, "watcher_scale.py": 24, "refusal.py": 19,
           "log_loss.py": 15, "rehearsal_compare.py": 15, "pr_watch_requests.py": 11, "approve_at_green.py": 10,
           "suite_under_load.py": 6, "iris_compat.py": 6, "redaction.py": 2}
DOCS = [ROOT / "docs" / "benchmarks.md", BENCH / "README.md", ROOT / "README.md"]
TABLE_RULE = re.compile(r"^\|(\s*:?-{3,}:?\s*\|)+\s*$", re.M)


def _env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(ROOT)}


def _run(args: list[str], timeout: float) -> tuple[int, str, str, float, float]:
    """Run a bench in its own process group: (exit code, stdout, stderr, wall s, CPU s of it and every
    child it reaped, from ``wait4``). On a timeout it gets SIGINT first (KeyboardInterrupt: its ``finally``
    stops the servers it started in sessions of their own), then its group SIGTERM, SIGKILL."""
    started = time.monotonic()
    p = subprocess.Popen([sys.executable, *args], cwd=ROOT, env=_env(), stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True, stdin=subprocess.DEVNULL, start_new_session=True)
    with ThreadPoolExecutor(2) as io:
        out, err = io.submit(p.stdout.read), io.submit(p.stderr.read)

        def reaped(within: float):
            end = time.monotonic() + within
            while time.monotonic() < end:
                pid, status, usage = os.wait4(p.pid, os.WNOHANG)
                if pid:
                    p.returncode = os.waitstatus_to_exitcode(status)  # Popen must not wait for it again
                    return usage.ru_utime + usage.ru_stime
                time.sleep(0.2)
            return None

        cpu, note = reaped(timeout), ""
        if cpu is None:
            note = f"\n(timed out after {timeout:.0f} s)"
            for sig, wait in ((signal.SIGINT, 30), (signal.SIGTERM, 10), (signal.SIGKILL, 1e9)):
                with contextlib.suppress(ProcessLookupError):
                    if sig == signal.SIGINT:
                        os.kill(p.pid, sig)
                    else:
                        os.killpg(p.pid, sig)
                if (cpu := reaped(wait)) is not None:
                    break
        rc = p.returncode if not note else -1
        return rc, out.result(), err.result() + note, time.monotonic() - started, cpu


def test_every_script_under_bench_is_a_bench_or_a_named_helper():
    assert len(BENCHES) >= 14, BENCHES
    for helper in HELPERS:
        assert (BENCH / helper).exists(), f"{helper} is listed as a helper but no longer exists"


def _cpu(who: int) -> float:
    r = resource.getrusage(who)
    return r.ru_utime + r.ru_stime


def attaches(bench: str) -> bool:
    """The bench takes ``--stack`` (bench/_stack.py): it runs on the one stack this test starts."""
    return "add_stack_flag(" in (BENCH / bench).read_text()


def schedule(benches: list[str], slots: int, stack_ready, run) -> dict[str, tuple]:
    """Run ``benches`` in ``slots`` threads, longest first (SMOKE_S); a free slot takes the longest bench
    it may start: one that attaches only once ``stack_ready()`` (so no slot idles while the stack starts)."""
    todo = sorted(benches, key=lambda b: -SMOKE_S.get(b, float("inf")))
    lock, runs = threading.Lock(), {}

    def slot() -> None:
        while True:
            with lock:
                if not todo:
                    return
                ready = stack_ready()
                bench = next((b for b in todo if ready or not attaches(b)), None)
                if bench is not None:
                    todo.remove(bench)
            if bench is None:
                time.sleep(0.5)
                continue
            try:
                runs[bench] = run(bench)
            except Exception as e:  # noqa: BLE001 - a slot that died would leave its bench unreported
                runs[bench] = (-1, "", f"the smoke test could not run it: {e!r}", 0.0, 0.0)

    threads = [threading.Thread(target=slot, daemon=True) for _ in range(slots)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return runs


@pytest.mark.timeout(1800)
def test_every_bench_runs_at_its_smoke_size_and_prints_its_table(tmp_path):
    """The benches that start a sandbox stack share one (started here while the others run): each starts
    only its own remotes, GitHub stand-in and task queue on it (bench/_stack.py)."""
    assert {"pipeline_e2e.py", "resume_after_kill.py", "refusal.py", "approve_at_green.py"} <= \
        {b for b in BENCHES if attaches(b)}
    cpu0 = _cpu(resource.RUSAGE_CHILDREN) + _cpu(resource.RUSAGE_SELF)
    with ThreadPoolExecutor(1) as starter:
        stack = starter.submit(lambda: SandboxStack(tmp_path / "stack").start())

        def run(bench: str):
            if not attaches(bench):
                return _run([f"bench/{bench}", "--smoke"], SMOKE_TIMEOUT_S)
            try:
                stack_json = stack.result().stack_json
            except Exception as e:  # noqa: BLE001 - every attaching bench reports it
                return -1, "", f"the shared sandbox stack did not start: {e}", 0.0, 0.0
            return _run([f"bench/{bench}", "--smoke", "--stack", str(stack_json)], SMOKE_TIMEOUT_S)

        try:
            runs = schedule(BENCHES, PARALLEL, stack.done, run)
            assert sorted(runs) == BENCHES, sorted(set(BENCHES) - set(runs))
        finally:
            with contextlib.suppress(Exception):
                stack.result().stop()
    stack_cpu = _cpu(resource.RUSAGE_CHILDREN) + _cpu(resource.RUSAGE_SELF) - cpu0 - sum(r[4] for r in runs.values())
    wrong = []
    for bench, (rc, out, err, took, _) in runs.items():
        tail = "\n    ".join(err.strip().splitlines()[-12:])
        if rc != 0:
            wrong.append(f"bench/{bench} --smoke exited {rc} after {took:.0f} s:\n    {tail}")
        elif not TABLE_RULE.search(out):
            wrong.append(f"bench/{bench} --smoke printed no Markdown table:\n{out[-1500:]}")
    print("smoke runs (wall s / CPU s): " + ", ".join(
        f"{b} {r[3]:.0f}/{r[4]:.0f}" for b, r in sorted(runs.items(), key=lambda x: -x[1][3])))
    print(f"the shared stack (services reaped by this process, stand-ins' threads): {stack_cpu:.0f} CPU s; "
          f"all benches: {sum(r[4] for r in runs.values()):.0f} CPU s; load {os.getloadavg()[0]:.1f}")
    assert not wrong, "\n".join(wrong)


def test_the_schedule_starts_an_attaching_bench_only_once_the_stack_is_up():
    """Every bench runs once; while the stack starts the slots run the others; then the attaching ones."""
    ready, started = threading.Event(), []

    def run(bench):
        started.append((bench, ready.is_set()))
        if bench == "redaction.py":  # the last non-attaching bench: the stack comes up while it runs
            ready.set()
        return 0, "", "", 0.0, 0.0

    benches = ["pipeline_e2e.py", "refusal.py", "redaction.py", "log_loss.py"]
    runs = schedule(benches, 2, ready.is_set, run)
    assert sorted(runs) == sorted(benches)
    assert [b for b, up in started if attaches(b) and not up] == []
    assert {b for b, _ in started[:2]} == {"log_loss.py", "redaction.py"}


# ------------------------------------------------------------------------------ printed commands
def printed_commands() -> list[tuple[str, str]]:
    """(where, command) for every inline code span that runs a bench script, e.g.
    ``.venv/bin/python bench/monitoring.py --lead 75``. The spans are CommonMark's own (markdown-it-py, the
    parser domain/contract uses): a regex pairing backticks took the prose between two spans for a command
    (`a` ... this commit's bench/x.py ... `b`), and a span wrapped over two lines was missed."""
    found = []
    md = MarkdownIt("commonmark")
    for doc in DOCS:
        for token in md.parse(doc.read_text()):
            for child in token.children or []:
                if child.type == "code_inline" and re.search(r"(?:^|\s)bench/[a-z_]+\.py(?:\s|$)", child.content):
                    found.append((f"{doc.relative_to(ROOT)}", child.content))
    return found


def flags_of(command: str) -> tuple[str, list[str]]:
    """The script and the long flags a printed command passes it (``[--n 3]`` optional parts included;
    nothing after a bare ``--``, which goes to pytest)."""
    words = shlex.split(command.replace("[", " ").replace("]", " ").replace("<", "'<").replace(">", ">'"))
    script = next(w for w in words if re.fullmatch(r"bench/[a-z_]+\.py", w))
    flags = []
    for w in words[words.index(script) + 1:]:
        if w == "--":
            break
        if w.startswith("--"):
            flags.append(w.split("=", 1)[0])
    return script, flags


def test_printed_commands_are_found():
    commands = printed_commands()
    assert len(commands) >= 20, commands  # the extraction still sees the docs' commands
    assert flags_of(".venv/bin/python bench/suite_under_load.py --runs 5 --stress-cpu 2 -- --durations=15") == \
        ("bench/suite_under_load.py", ["--runs", "--stress-cpu"])
    assert flags_of("bench/log_loss.py [--bursts 5000,10000] [--n 3]") == ("bench/log_loss.py", ["--bursts", "--n"])


@pytest.fixture(scope="module")
def help_texts() -> dict[str, str]:
    scripts = sorted({flags_of(c)[0] for _, c in printed_commands()})
    with ThreadPoolExecutor(PARALLEL) as pool:
        futures = {s: pool.submit(_run, [s, "--help"], 120) for s in scripts}
        return {s: f.result() for s, f in futures.items()}


def test_every_printed_bench_command_names_a_script_and_flags_it_accepts(help_texts):
    wrong = []
    for where, command in printed_commands():
        script, flags = flags_of(command)
        if not (ROOT / script).exists():
            wrong.append(f"{where}: `{command}`: {script} does not exist")
            continue
        rc, out, err, *_ = help_texts[script]
        if rc != 0:
            wrong.append(f"{where}: `{command}`: {script} --help exited {rc}: {err.strip()[-300:]}")
            continue
        accepted = set(re.findall(r"(--[a-z][a-z0-9-]*)", out))
        for flag in flags:
            if flag not in accepted:
                wrong.append(f"{where}: `{command}`: {script} has no {flag} (it accepts {sorted(accepted)})")
    assert not wrong, "\n".join(wrong)


def runs_as_printed(command: str) -> bool:
    """A printed command with flags runs as printed: a Python interpreter comes before the script, or the
    script is executable with a ``#!`` line (``bench/x.py --n 3`` alone, pasted into a shell, is refused)."""
    script, _ = flags_of(command)
    words = shlex.split(command.replace("[", " ").replace("]", " ").replace("<", "'<").replace(">", ">'"))
    before = words[:words.index(script)]
    if any(re.search(r"(^|/)python[0-9.]*$", w) for w in before):
        return True
    path = ROOT / script
    return not before and os.access(path, os.X_OK) and path.read_text().startswith("#!")


def test_every_printed_bench_command_runs_as_printed():
    wrong = [f"{where}: `{command}`" for where, command in printed_commands()
             if flags_of(command)[1] and not runs_as_printed(command)]
    assert not wrong, "printed without an interpreter (prefix `.venv/bin/python `):\n" + "\n".join(wrong)
    assert not runs_as_printed("bench/monitoring.py --sizes 1,10")  # the form the check refuses
    assert runs_as_printed(".venv/bin/python bench/monitoring.py --sizes 1,10")


def test_a_command_with_an_unknown_flag_is_caught(help_texts):
    """The check above fails on a command the script would refuse (a flag it does not have)."""
    rc, out, *_ = help_texts["bench/monitoring.py"]
    accepted = set(re.findall(r"(--[a-z][a-z0-9-]*)", out))
    _, flags = flags_of(".venv/bin/python bench/monitoring.py --lead 75 --no-such-flag 3")
    assert rc == 0 and [f for f in flags if f not in accepted] == ["--no-such-flag"]
