"""``python -m sandbox up|down|status --state-dir D``: run the local stack from a shell.

``up`` starts everything, prints the endpoints and the config path, and stays in the foreground
until Ctrl-C or SIGTERM, then stops everything it started. ``down`` stops a stack started elsewhere
by the pids in ``stack.json``; ``status`` reports which recorded processes are alive.
"""

from __future__ import annotations

import argparse
import json
import signal
import sys
import threading
from pathlib import Path

from sandbox.stack import SandboxStack, recorded_status, stop_recorded


def _up(state_dir: Path, github: bool) -> int:
    done = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: done.set())
    stack = SandboxStack(state_dir, github=github)
    try:
        stack.start()
        endpoints = stack.endpoints()
        print(json.dumps(endpoints, indent=2), flush=True)
        if endpoints["temporal"]["ui_url"]:
            print(f"Temporal UI: {endpoints['temporal']['ui_url']}", flush=True)
        print("Ctrl-C or `python -m sandbox down --state-dir ...` to stop", flush=True)
        print(f"sandbox up; config: {stack.config_path} (export GPU_RL_BUILDER_CONFIG={stack.config_path})",
              flush=True)
        while not done.wait(1.0):
            pass
    finally:
        stack.stop()
        print("sandbox stopped", flush=True)
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m sandbox", description=__doc__.splitlines()[0])
    parser.add_argument("command", choices=["up", "down", "status"])
    parser.add_argument("--state-dir", type=Path, required=True)
    parser.add_argument("--no-github", action="store_true", help="up: skip the GitHub stand-in")
    args = parser.parse_args(argv)
    if args.command == "up":
        return _up(args.state_dir, github=not args.no_github)
    if args.command == "down":
        alive = stop_recorded(args.state_dir)
        print(f"stopped {len(alive)} running process(es): {alive}" if alive else "nothing running")
        return 0
    status = recorded_status(args.state_dir)
    print(json.dumps(status, indent=2))
    return 0 if status.get("running") else 1


if __name__ == "__main__":
    sys.exit(main())
