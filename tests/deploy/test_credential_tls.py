"""The worker and the starter refuse a configuration that would send a credential over plain http to a host
that is not loopback: exit 2, one line naming the key, before any connection (issue #27 item 2). Before,
an ``http://`` GitHub or Iris address started the worker without a word.

The "remote" addresses are real TCP listeners on this machine's own non-loopback interface, so a process
that did connect would be seen (tests/deploy/test_api_key_transport.py's recorder)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.deploy.test_api_key_transport import Recorder, _non_loopback_ip

ROOT = Path(__file__).resolve().parents[2]
GH_TOKEN = "sentinel-github-token-tls-5d1e"
IRIS_TOKEN = "sentinel-iris-token-tls-77c0"


def _config(tmp: Path, *, github_api: str, controller: str) -> Path:
    path = tmp / "config.toml"
    path.write_text(f"""
work_dir = "{tmp / 'work'}"
[temporal]
address = "127.0.0.1:1"
[repos]
marinskyrl_url = "file:///nonexistent/MarinSkyRL.git"
harbor_url = "file:///nonexistent/harbor.git"
[clusters.remote]
controller_url = "{controller}"
token = {{kind = "env", name = "SENTINEL_IRIS_TOKEN"}}
[registry]
image_repository = "127.0.0.1:5000/gpu-rl"
user = {{kind = "literal_public", value = "builder"}}
token = {{kind = "env", name = "UNUSED_REGISTRY_TOKEN"}}
[github]
api_url = "{github_api}"
token = {{kind = "env", name = "SENTINEL_GH_TOKEN"}}
""")
    return path


def _run(script: str, config: Path, *args: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith("TEMPORAL_")}
    env.update(SENTINEL_GH_TOKEN=GH_TOKEN, SENTINEL_IRIS_TOKEN=IRIS_TOKEN, PYTHONPATH=str(ROOT))
    return subprocess.run([sys.executable, str(ROOT / script), "--config", str(config), *args],
                          capture_output=True, text=True, timeout=120, env=env, cwd=ROOT)


@pytest.mark.parametrize("script, args", [("worker.py", ()), ("starter.py", ("status",))])
@pytest.mark.parametrize("which", ["github.api_url", "clusters.remote.controller_url"])
def test_plain_http_to_a_remote_host_is_refused_at_start_naming_the_key(tmp_path, script, args, which):
    ip = _non_loopback_ip()
    if ip is None:
        pytest.skip("this machine has no non-loopback IPv4 address to listen on")
    remote = Recorder(ip)
    try:
        good = "https://127.0.0.1:1"
        bad = f"http://{remote.address}"
        config = _config(tmp_path, github_api=bad if which == "github.api_url" else good,
                         controller=bad if which != "github.api_url" else good)
        out = _run(script, config, *args)
    finally:
        remote.close()
    assert out.returncode == 2, out
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and f"{which} = 'http://{remote.address}'" in lines[0], out.stderr
    assert "cleartext" in lines[0] and "Traceback" not in out.stderr
    assert GH_TOKEN not in out.stderr + out.stdout and IRIS_TOKEN not in out.stderr + out.stdout
    assert (remote.connections, remote.bytes) == (0, 0)
