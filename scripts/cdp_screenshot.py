"""Screenshot pages with headless chromium over the DevTools protocol: ``cdp_screenshot.py URL OUT [URL OUT ...]``.

Why not ``chromium --screenshot``: a running workflow's page in the Temporal UI keeps polling, so
``--virtual-time-budget`` never elapses and the one-shot screenshot never comes. Here each page gets a
fixed settle time, then ``Page.captureScreenshot``. Uses ``websockets`` (already in the venv).
"""

from __future__ import annotations

import asyncio
import base64
import itertools
import json
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import websockets

SETTLE_S = 10.0
WIDTH, HEIGHT = 1600, 1300


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


async def _shoot(ws_url: str, pages: list[tuple[str, str]]) -> None:
    ids = itertools.count(1)
    async with websockets.connect(ws_url, max_size=64 * 1024 * 1024) as ws:
        async def call(method: str, **params):
            mid = next(ids)
            await ws.send(json.dumps({"id": mid, "method": method, "params": params}))
            while True:
                msg = json.loads(await ws.recv())
                if msg.get("id") == mid:
                    if "error" in msg:
                        raise RuntimeError(f"{method}: {msg['error']}")
                    return msg.get("result", {})

        await call("Emulation.setDeviceMetricsOverride", width=WIDTH, height=HEIGHT, deviceScaleFactor=1, mobile=False)
        for url, out in pages:
            await call("Page.navigate", url=url)
            await asyncio.sleep(SETTLE_S)
            shot = await call("Page.captureScreenshot", format="png")
            await asyncio.to_thread(Path(out).write_bytes, base64.b64decode(shot["data"]))
            print(f"wrote {out} ({url})")


def main(argv: list[str]) -> int:
    pairs = list(zip(argv[::2], argv[1::2], strict=True))
    port = _free_port()
    with tempfile.TemporaryDirectory(prefix="cdp-chromium.") as profile:
        proc = subprocess.Popen(
            ["chromium", "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run", "--disable-sync",
             "--disable-background-networking", "--disable-component-update", f"--user-data-dir={profile}",
             f"--remote-debugging-port={port}", f"--window-size={WIDTH},{HEIGHT}", "about:blank"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
        try:
            deadline = time.monotonic() + 30
            while True:
                try:
                    with urllib.request.urlopen(f"http://127.0.0.1:{port}/json/list", timeout=2) as r:
                        targets = [t for t in json.load(r) if t.get("type") == "page"]
                    if targets:
                        break
                except OSError:
                    pass
                if time.monotonic() > deadline:
                    raise RuntimeError("chromium did not open its DevTools port")
                time.sleep(0.3)
            asyncio.run(_shoot(targets[0]["webSocketDebuggerUrl"], pairs))
        finally:
            proc.terminate()
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
