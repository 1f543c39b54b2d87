"""A refusal never waits on a cluster: with one configured controller unreachable (a socket that
accepts connections and never answers), ``build --arch riscv64`` exits 2 naming the flag, and no
controller was asked at all. When every configured cluster declares its architecture the starter
refuses from the configuration before anything is started; when the unreachable one declares none,
planning refuses (every input check runs against the configuration first; only the clusters the plan
uses are asked for their live architecture, concurrently and within a short deadline).

The refusal's wall time is a benchmark figure (``bench/refusal.py``), not asserted here; what makes it
independent of the dead controller is: no connection reached it."""

from __future__ import annotations

import datetime
import re
import socket
import time
import uuid

import pytest

from domain.config import load_config
from tests.cli.starter_cli import starter
from worker import build_worker

pytestmark = pytest.mark.stack

OK_REQUEST = ("--requested-by", "tester", "--reason", "refusal with a cluster down")


def _with_dead_cluster(text: str, port: int, queue: str, declared: str | None) -> str:
    text = re.sub(r'task_queue = "[^"]*"', f'task_queue = "{queue}"', text)
    return text + (f'\n[clusters.sandbox-down]\ncontroller_url = "http://127.0.0.1:{port}"\n'
                   f'client_revision_date = "{datetime.date.today().isoformat()}"\n'
                   + (f'architecture = "{declared}"\n' if declared else ""))


@pytest.mark.parametrize("declared", ["amd64", None], ids=["refused-by-config", "refused-by-planning"])
async def test_unknown_arch_with_a_controller_down_exits_2_without_asking_any_controller(service_config, tmp_path,
                                                                                        declared):
    s = service_config
    with socket.socket() as dead:
        dead.bind(("127.0.0.1", 0))
        dead.listen(64)  # connections complete in the kernel and are never answered
        dead.setblocking(False)
        cfg = tmp_path / "down.toml"
        cfg.write_text(_with_dead_cluster(s.config_path.read_text(), dead.getsockname()[1],
                                          f"down-{uuid.uuid4().hex[:8]}", declared))
        config = load_config(cfg)
        assert "sandbox-down" in config.clusters
        async with build_worker(s.client, config, graceful_shutdown_s=2):
            started = time.monotonic()
            ran = await starter(cfg, "build", "--arch", "riscv64", "--variant", "standard", *OK_REQUEST, timeout=120)
            took = time.monotonic() - started
        connections = 0
        while True:
            try:
                dead.accept()[0].close()
                connections += 1
            except BlockingIOError:
                break
    assert ran.code == 2, ran.text
    errors = [line for line in ran.err.splitlines() if line.startswith("error: ")]
    assert len(errors) == 1 and "riscv64" in errors[0] and "--arch" in errors[0], ran.err
    # Which of the two refused: the configuration's words, or the build script's (read by planning).
    assert ("no configured cluster runs riscv64" in errors[0]) == (declared is not None), errors[0]
    assert connections == 0, f"planning asked the unreachable controller ({connections} connections)"
    print(f"refused in {took:.2f}s with a controller down")  # the figure; bench/refusal.py measures it
