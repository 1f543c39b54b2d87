"""Session-wide test setup.

Each area keeps its real-service fixtures in ``tests/fixtures_<area>.py``; they are loaded here as
plugins so one stack of real services (started lazily, once per session) serves the whole suite.
"""

from pathlib import Path

pytest_plugins = sorted(
    f"tests.{p.stem}" for p in Path(__file__).parent.glob("fixtures_*.py")
)


def pytest_configure(config):
    """A SIGTERM (CI timeout, `timeout`, a cancelled job) ends the session like Ctrl-C, so the fixtures'
    finalizers and atexit hooks stop every service process the session started.

    KeyboardInterrupt, not SystemExit: pytest records a SystemExit raised inside a running test as that
    test's failure and goes on with the next test; an interrupt ends the session and tears it down."""
    import signal

    def _terminate(signum, _frame):
        raise KeyboardInterrupt(f"signal {signum}")

    signal.signal(signal.SIGTERM, _terminate)
