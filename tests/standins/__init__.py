"""Stand-ins for tools that cannot run here (kubectl), and how a test configures them."""

from __future__ import annotations

import shlex
from pathlib import Path

KUBECTL_STANDIN = Path(__file__).with_name("kubectl_standin")


def configured_kubectl(where: Path, **env: str) -> str:
    """A ``kubectl`` executable at ``where`` that runs the stand-in with ``env`` (KUBECTL_STANDIN_*).

    The service starts kubectl with an allow-listed environment (clients/child_env.py), so a test's
    ``monkeypatch.setenv`` never reaches it, as a worker's own variables never reach a real kubectl;
    the stand-in's settings travel with the executable the configuration names instead."""
    exports = "".join(f"export {k}={shlex.quote(v)}\n" for k, v in env.items())
    where.write_text(f"#!/bin/sh\n{exports}exec {shlex.quote(str(KUBECTL_STANDIN))} \"$@\"\n")
    where.chmod(0o755)
    return str(where)
