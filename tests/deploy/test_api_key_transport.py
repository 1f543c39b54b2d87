"""Secure by default on the wire: a Temporal API key without TLS is refused before a single byte is sent
to a non-loopback address (exit 2, one line), and only warned about for loopback (issue #21 item 4).

The "remote" server is a real TCP listener on this machine's own non-loopback interface address, so a
client that did connect would be seen: it counts connections and bytes."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from domain.config import ConfigError, TemporalSettings, is_loopback_host, split_address
from runtime.temporal import check_transport

ROOT = Path(__file__).resolve().parents[2]
KEY = "sentinel-api-key-transport-91b2"


def _non_loopback_ip() -> str | None:
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        s.connect(("192.0.2.123", 9))  # no packet is sent for a UDP connect; it picks the outgoing interface
        ip = s.getsockname()[0]
    except OSError:
        return None
    finally:
        s.close()
    return None if is_loopback_host(ip) else ip


class Recorder:
    """A TCP listener that counts connections and the bytes clients send (then closes them)."""

    def __init__(self, host: str):
        self.sock = socket.create_server((host, 0))
        self.sock.settimeout(0.2)
        self.address = f"{host}:{self.sock.getsockname()[1]}"
        self.connections = 0
        self.bytes = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        while not self._stop.is_set():
            try:
                conn, _ = self.sock.accept()
            except TimeoutError:
                continue
            self.connections += 1
            conn.settimeout(1.0)
            try:
                while chunk := conn.recv(65536):
                    self.bytes += len(chunk)
            except OSError:
                pass
            conn.close()

    def close(self) -> None:
        self._stop.set()
        self._thread.join(5)
        self.sock.close()


def _config(tmp: Path, address: str) -> Path:
    path = tmp / "config.toml"
    path.write_text(f"""
work_dir = "{tmp / 'work'}"
[temporal]
address = "{address}"
api_key = {{kind = "env", name = "SENTINEL_TEMPORAL_KEY"}}
[repos]
marinskyrl_url = "file:///nonexistent/MarinSkyRL.git"
harbor_url = "file:///nonexistent/harbor.git"
[clusters.local]
controller_url = "http://127.0.0.1:1"
client_revision_date = "2026-11-20"
[registry]
image_repository = "127.0.0.1:5000/gpu-rl"
user = {{kind = "literal_public", value = "builder"}}
token = {{kind = "env", name = "UNUSED_REGISTRY_TOKEN"}}
""")
    return path


def _starter(config: Path, *args: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith("TEMPORAL_")}
    env.update(SENTINEL_TEMPORAL_KEY=KEY, PYTHONPATH=str(ROOT))
    return subprocess.run([sys.executable, str(ROOT / "starter.py"), "--config", str(config), *args],
                          capture_output=True, text=True, timeout=120, env=env, cwd=ROOT)


def test_api_key_without_tls_to_a_remote_address_sends_nothing(tmp_path):
    ip = _non_loopback_ip()
    if ip is None:
        pytest.skip("this machine has no non-loopback IPv4 address to listen on")
    remote = Recorder(ip)
    try:
        out = _starter(_config(tmp_path, remote.address), "status")
    finally:
        remote.close()
    assert out.returncode == 2, out
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and "refusing to send the API key in cleartext" in lines[0], out.stderr
    assert "Traceback" not in out.stderr and KEY not in out.stderr + out.stdout
    assert (remote.connections, remote.bytes) == (0, 0)


def test_api_key_without_tls_to_loopback_warns_and_connects(tmp_path):
    local = Recorder("127.0.0.1")
    try:
        out = _starter(_config(tmp_path, local.address), "status")
    finally:
        local.close()
    assert "warning: the Temporal API key goes in cleartext" in out.stderr, out.stderr
    assert "Traceback" not in out.stderr
    assert local.connections >= 1 and local.bytes > 0  # the listener does see a client that connects
    assert out.returncode == 3  # not a Temporal server: unreachable, as documented


@pytest.mark.parametrize("address, loopback", [("localhost:7233", True), ("127.0.0.2:7233", True),
                                               ("[::1]:7233", True), ("temporal.internal:7233", False),
                                               ("10.0.0.1:7233", False), ("127.example.org:7233", False)])
def test_transport_check_by_address(address, loopback):
    from domain.config import CredentialSource

    s = TemporalSettings(address=address, api_key=CredentialSource(kind="env", name="K"))
    if loopback:
        assert "warning" in check_transport(s)
    else:
        with pytest.raises(ConfigError, match="temporal.api_key is set but TLS is off"):
            check_transport(s)
    assert check_transport(s.model_copy(update={"tls": True})) is None
    assert split_address(address)[1] == 7233
