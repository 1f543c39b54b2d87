"""Which process listens on a port: the readiness checks' proof that a server answering is the one started.

Why: the sandbox chooses free ports in the parent (bind 0, close) and the server binds them a moment later;
another process can take the port in between (it happened between the two xdist workers' services). The
server then fails to bind, while whatever holds the port answers the readiness probe. Read from /proc (Linux),
standard library only.
"""

from __future__ import annotations

import os
from pathlib import Path


def listening_ports(pid: int) -> set[int]:
    """TCP ports (IPv4 and IPv6) that ``pid`` listens on: its socket inodes matched against /proc/net/tcp*.
    Empty when the process is gone."""
    inodes = set()
    try:
        fds = list(Path(f"/proc/{pid}/fd").iterdir())
    except OSError:
        return set()
    for fd in fds:
        try:
            target = os.readlink(fd)
        except OSError:
            continue
        if target.startswith("socket:["):
            inodes.add(target[8:-1])
    ports = set()
    for table in ("tcp", "tcp6"):
        try:
            lines = Path(f"/proc/{pid}/net/{table}").read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            if fields[3] == "0A" and fields[9] in inodes:  # 0A: LISTEN
                ports.add(int(fields[1].rsplit(":", 1)[1], 16))
    return ports
