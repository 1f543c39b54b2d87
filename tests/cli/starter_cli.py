"""Run ``starter.py`` as an operator would: a separate process talking to the test's Temporal server.

Async on purpose: the test's worker runs in the test's own event loop, so a blocking
``subprocess.run`` would stall the very workflows the command is waiting for.
"""

from __future__ import annotations

import asyncio
import atexit
import os
import signal
import sys
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
STARTER = ROOT / "starter.py"


@dataclass
class Ran:
    code: int
    out: str
    err: str

    @property
    def text(self) -> str:
        return self.out + self.err


_LIVE: set = set()


@atexit.register
def _kill_leftovers() -> None:
    for proc in list(_LIVE):
        kill_group(proc)


async def _spawn(config_path: Path, *args: str):
    proc = await asyncio.create_subprocess_exec(
        *argv(config_path, *args), cwd=ROOT, env=_env(), start_new_session=True,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    _LIVE.add(proc)
    return proc


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TEMPORAL_", "GPU_RL_BUILDER_"))}
    env["PYTHONUNBUFFERED"] = "1"
    return env


def argv(config_path: Path, *args: str) -> list[str]:
    return [sys.executable, str(STARTER), "--config", str(config_path), *args]


async def starter(config_path: Path, *args: str, timeout: float = 240.0) -> Ran:
    """Run one command to completion (bounded) and return its exit code and output."""
    proc = await _spawn(config_path, *args)
    try:
        out, err = await asyncio.wait_for(proc.communicate(), timeout)
    except TimeoutError:
        kill_group(proc)
        await proc.wait()
        raise AssertionError(f"starter {' '.join(args)} did not finish within {timeout:.0f}s") from None
    finally:
        _LIVE.discard(proc)
    return Ran(proc.returncode, out.decode(), err.decode())


async def starters(config_path: Path, *commands: tuple[str, ...], limit: int = 4,
                   timeout: float = 240.0) -> list[Ran]:
    """Run independent commands concurrently (at most ``limit`` at a time), results in the given order.

    Why: each command is a fresh interpreter that spends most of its life importing and waiting on the
    server; running a test's independent commands side by side costs the same checks less wall time."""
    gate = asyncio.Semaphore(limit)

    async def one(args: tuple[str, ...]) -> Ran:
        async with gate:
            return await starter(config_path, *args, timeout=timeout)
    return list(await asyncio.gather(*(one(args) for args in commands)))


class Follower:
    """A long-running ``starter.py follow`` whose output is read line by line while it runs."""

    def __init__(self, proc: asyncio.subprocess.Process):
        self.proc = proc
        self.lines: list[str] = []
        self.err = ""

    @classmethod
    async def start(cls, config_path: Path, *args: str) -> Follower:
        return cls(await _spawn(config_path, *args))

    async def read_until(self, predicate, timeout: float = 240.0) -> str:
        """Read output lines until one satisfies ``predicate``; return that line."""
        async def go():
            while True:
                raw = await self.proc.stdout.readline()
                if not raw:
                    raise AssertionError("follow ended before the expected line; output:\n" + "\n".join(self.lines))
                line = raw.decode().rstrip("\n")
                self.lines.append(line)
                if predicate(line):
                    return line
        return await asyncio.wait_for(go(), timeout)

    async def interrupt(self, timeout: float = 30.0) -> int:
        """Ctrl-C, as an operator closing the terminal would; returns the exit code."""
        self.proc.send_signal(signal.SIGINT)
        return await self.finish(timeout)

    async def finish(self, timeout: float = 240.0) -> int:
        try:
            out, err = await asyncio.wait_for(self.proc.communicate(), timeout)
        except TimeoutError:
            kill_group(self.proc)
            await self.proc.wait()
            rest = []  # what it printed after the last line read, and its stderr: why it did not end
            for stream in (self.proc.stdout, self.proc.stderr):
                try:
                    rest.append((await asyncio.wait_for(stream.read(), 5)).decode(errors="replace")[-4000:])
                except (TimeoutError, ValueError, AttributeError):
                    rest.append("")
            raise AssertionError("follow did not end in time; output:\n" + "\n".join(self.lines) + rest[0]
                                 + "\nstderr:\n" + self.err + rest[1]) from None
        _LIVE.discard(self.proc)
        self.lines.extend(out.decode().splitlines())
        self.err += err.decode()
        return self.proc.returncode

    def stop(self) -> None:
        """Idempotent cleanup for a test that failed half-way."""
        if self.proc.returncode is None:
            kill_group(self.proc)

    @property
    def output(self) -> str:
        return "\n".join(self.lines)


def kill_group(proc) -> None:
    if proc.returncode is not None:
        return
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def minimal_config(tmp_path: Path, address: str, queue: str) -> Path:
    """A configuration that reaches only Temporal (``address``, ``queue``): for commands against stand-in
    workflows, which read no repository, registry or cluster."""
    path = tmp_path / f"{queue}.toml"
    path.write_text(f"""work_dir = "{tmp_path / 'work'}"
[temporal]
address = "{address}"
namespace = "default"
task_queue = "{queue}"
[repos]
marinskyrl_url = "file:///nonexistent/m.git"
harbor_url = "file:///nonexistent/h.git"
[registry]
image_repository = "127.0.0.1:5000/x/y"
user = {{kind = "literal_public", value = "u"}}
token = {{kind = "env", name = "GRB_UNSET_TOKEN"}}
[clusters]
""")
    return path
