"""Session-wide test setup.

Each area keeps its real-service fixtures in ``tests/fixtures_<area>.py``; they are loaded here as
plugins so one stack of real services (started lazily, once per session) serves the whole suite.
"""

from pathlib import Path

import pytest

pytest_plugins = sorted(
    f"tests.{p.stem}" for p in Path(__file__).parent.glob("fixtures_*.py")
)


@pytest.hookimpl(trylast=True)  # after pytest's own reordering by fixture scope, so it is not undone
def pytest_collection_modifyitems(config, items):
    """Known-slow tests first, spread over the xdist workers' chunks (tests/schedule.py says why). Under
    xdist every worker computes the same order from the same collection, as the scheduler requires."""
    from tests.schedule import order

    workers = config.workerinput["workercount"] if hasattr(config, "workerinput") else 1
    items[:] = [items[i] for i in order([item.nodeid for item in items], workers)]


def pytest_configure(config):
    """A SIGTERM (CI timeout, `timeout`, a cancelled job) ends the session like Ctrl-C, so the fixtures'
    finalizers and atexit hooks stop every service process the session started.

    KeyboardInterrupt, not SystemExit: pytest records a SystemExit raised inside a running test as that
    test's failure and goes on with the next test; an interrupt ends the session and tears it down.

    Under pytest-xdist (scripts/test) the SIGTERM reaches the controller only; it passes it on to its
    workers (its child processes) first, so each ends its running test and stops its own stack at once.
    Without that the controller's shutdown waits for every worker's current test to finish."""
    import os
    import signal

    controller = not hasattr(config, "workerinput")

    def _terminate(signum, _frame):
        if controller:
            for child in _children(os.getpid()):
                try:
                    os.kill(child, signal.SIGTERM)
                except ProcessLookupError:
                    pass
        raise KeyboardInterrupt(f"signal {signum}")

    signal.signal(signal.SIGTERM, _terminate)
    _cache_bytecode_outside_the_tree()


def _cache_bytecode_outside_the_tree() -> None:
    """With PYTHONDONTWRITEBYTECODE set (some shells and sandboxes set it), every Python process the suite starts
    (each CLI command, worker.py, bench, sandbox demo: hundreds) compiled the project's ~85 modules from source
    on import, 0.3 CPU s each on a 2-core machine (docs/benchmarks.md, session 15). Instead the session and its
    children keep bytecode in a cache directory of their own (PYTHONPYCACHEPREFIX), so no ``__pycache__`` is
    written into a source tree, which is what the setting is usually for. An explicit prefix is kept."""
    import os

    if os.environ.pop("PYTHONDONTWRITEBYTECODE", None) is None:
        return
    cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "gpu-rl-builder-tests" / "pycache"
    os.environ.setdefault("PYTHONPYCACHEPREFIX", str(cache))


def _children(pid: int) -> list[int]:
    """The direct children of ``pid`` (the xdist workers, for the controller), from /proc."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        if int(stat.rsplit(")", 1)[1].split()[1]) == pid:
            found.append(int(entry.name))
    return found


# A retried test (@pytest.mark.flaky) that passes on its rerun shows only "R" and its name; its first failure is
# the evidence of the flake, so the summary prints it (the report reaches this controller from xdist workers too).
_RERUNS: list[tuple[str, str]] = []
RERUN_SHOWN_CHARS = 6000


def pytest_runtest_logreport(report):
    if report.outcome == "rerun":
        _RERUNS.append((report.nodeid, str(report.longrepr)[-RERUN_SHOWN_CHARS:]))


def pytest_terminal_summary(terminalreporter):
    for nodeid, text in _RERUNS:
        terminalreporter.write_sep("-", f"first failure of {nodeid} (retried once: a known flake)")
        terminalreporter.write_line(text)


# GRB_TEST_TIMES=<path>: each test's wall and CPU seconds, one JSON line per test appended to <path>.<worker> as it
# ends (read while the suite still runs), to find where a 2-core run's time goes (docs/benchmarks.md, session 15).
# CPU: this process's (the in-process workers, SDK threads, stand-ins) and its reaped children's (git, bwrap,
# proot, worker.py, CLI runs; a session service is reaped at teardown, so its CPU lands on the session's last test).
_TIMES = __import__("os").environ.get("GRB_TEST_TIMES")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    if not _TIMES:
        yield
        return
    import json
    import os
    import resource
    import time

    def cpu() -> tuple[float, float]:
        s, c = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
        return s.ru_utime + s.ru_stime, c.ru_utime + c.ru_stime

    worker = os.environ.get("PYTEST_XDIST_WORKER", "main")
    t0, (s0, c0), start = time.monotonic(), cpu(), time.time()
    yield
    s1, c1 = cpu()
    with open(f"{_TIMES}.{worker}", "a") as f:
        f.write(json.dumps({"id": item.nodeid, "start": round(start, 2), "wall": round(time.monotonic() - t0, 3),
                            "self_cpu": round(s1 - s0, 3), "child_cpu": round(c1 - c0, 3),
                            "load": os.getloadavg()[0]}) + "\n")
