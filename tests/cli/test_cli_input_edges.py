"""Input edges of issue #21 item 7, through ``starter.py``: one line, no traceback, exit 2, nothing created."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

from domain.issue_ref import check_issue_host, github_web_host
from tests.cli.starter_cli import ROOT, STARTER, starter
from tests.cli.test_cli_bad_input import OK_REQUEST, _branches, one_line_error
from tests.deploy.wheel_venv import minimal_config
from tests.visibility import workflows_started_on

BUILD = ("build", "--arch", "amd64", "--variant", "standard", "--cluster", "amd64=sandbox-amd64")


def test_issue_host_rules():
    assert github_web_host("https://api.github.com") == "github.com"
    assert github_web_host("https://ghe.example/api/v3") == "ghe.example"
    check_issue_host("https://github.com/marin-community/marin/issues/7920", "https://api.github.com")
    check_issue_host("marin-community/marin#7920", "https://api.github.com")
    with pytest.raises(ValueError, match="host gitlab.com is not the configured GitHub"):
        check_issue_host("https://gitlab.com/marin-community/marin/issues/7920", "https://api.github.com")


@pytest.mark.stack
async def test_issue_url_on_another_host_and_a_schedule_id_with_a_space_create_nothing(service_config):
    s = service_config
    before = _branches(s.remotes.marinskyrl_url)
    one_line_error(await starter(s.config_path, *BUILD, *OK_REQUEST, "--issue-url",
                                 "https://gitlab.com/marin-community/MarinSkyRL/issues/7"), 2,
                   "--issue-url", "host gitlab.com is not the configured GitHub")
    started = time.monotonic()
    one_line_error(await starter(s.config_path, "schedule", "create", "night ly", "--every", "24", "--arch", "amd64",
                                 *OK_REQUEST, timeout=60), 2, "SCHEDULE_ID 'night ly'")
    assert time.monotonic() - started < 60  # at once, not after a hang
    assert await workflows_started_on(s.client, s.task_queue) == []
    assert [sc async for sc in await s.client.list_schedules() if "night" in sc.id] == []
    assert _branches(s.remotes.marinskyrl_url) == before


def _run(config: str, *args: str, **env: str) -> subprocess.CompletedProcess:
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("TEMPORAL_", "GPU_RL_BUILDER_"))}
    return subprocess.run([sys.executable, str(STARTER), "--config", config, *args], capture_output=True,
                          text=True, timeout=120, cwd=ROOT, env={**clean, **env})


@pytest.mark.parametrize("case", ["directory", "not_utf8", "missing", "temporal_address", "temporal_address_port",
                                  "temporal_tls", "temporal_config_file"])
def test_no_traceback_for_any_config_or_temporal_value(tmp_path, case):
    config = minimal_config(tmp_path, "q-edges")
    env: dict[str, str] = {}
    path = str(config)
    if case == "directory":
        path = str(tmp_path)
    elif case == "not_utf8":
        config.write_bytes(config.read_bytes() + "# caf\xe9\n".encode("latin-1"))
    elif case == "missing":
        path = str(tmp_path / "nope.toml")
    elif case == "temporal_address":
        env["TEMPORAL_ADDRESS"] = "::::"
    elif case == "temporal_address_port":
        env["TEMPORAL_ADDRESS"] = "temporal.example:99999"
    elif case == "temporal_tls":
        env["TEMPORAL_TLS"] = "maybe"
    else:
        env["TEMPORAL_CONFIG_FILE"] = str(tmp_path)
    out = _run(path, "status", **env)
    lines = out.stderr.strip().splitlines()
    # TEMPORAL_TLS=maybe is read as "no TLS" by the SDK: the config's address (port 1) is then unreachable.
    assert out.returncode == (3 if case == "temporal_tls" else 2), out
    assert len(lines) == 1 and lines[0].startswith("error: ") and "Traceback" not in out.stderr, out.stderr


def test_an_unreachable_remote_with_a_url_password_is_exit_3_without_the_password(tmp_path):
    config = minimal_config(tmp_path, "q-edges")
    config.write_text(config.read_text().replace('marinskyrl_url = "file:///nonexistent/MarinSkyRL.git"',
                                                 'marinskyrl_url = "http://robot:s3cretPassw0rd@127.0.0.1:1/x.git"'))
    out = _run(str(config), "build", "--arch", "amd64", "--requested-by", "a", "--reason", "b")
    lines = out.stderr.strip().splitlines()
    assert out.returncode == 3 and len(lines) == 1 and lines[0].startswith("error: cannot read"), out
    assert "s3cretPassw0rd" not in out.stderr + out.stdout
