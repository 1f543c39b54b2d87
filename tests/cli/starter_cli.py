"""Run ``starter.py`` as an operator would: a separate process talking to the test's Temporal server.

Async on purpose: the test's worker runs in the test's own event loop, so a blocking
``subprocess.run`` would stall the very workflows the command is waiting for.
"""

from __future__ import annotations

import asyncio
import atexit
import contextlib
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


# An operator's command runs as a terminal's foreground job, where SIGINT has its default action. A suite started as a
# background job of a non-interactive shell (`scripts/test > log &`, `bash .ci/run &`, a runner doing the same)
# ignores SIGINT, and an ignored signal stays ignored across fork and exec: Python then installs no
# KeyboardInterrupt handler, asyncio.run none either, and the Ctrl-C of ``Follower.interrupt`` is dropped (the
# test_cli_operate flake: "follow did not end within 30s", SigIgn 0x6 = SIGINT + SIGQUIT). coreutils' ``env
# --default-signal`` gives the command the terminal's disposition back, for it alone (preexec_fn is unsafe in a
# process with threads, and this one runs the SDK core's).
TERMINAL_SIGNALS = ("env", "--default-signal=INT")


async def _spawn(config_path: Path, *args: str):
    proc = await asyncio.create_subprocess_exec(
        *TERMINAL_SIGNALS, *argv(config_path, *args), cwd=ROOT, env=_env(), start_new_session=True,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    _LIVE.add(proc)
    return proc


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TEMPORAL_", "GPU_RL_BUILDER_"))}
    env["PYTHONUNBUFFERED"] = "1"
    env["PYTHONFAULTHANDLER"] = "1"  # a command that hangs is sent SIGABRT first: its threads' stacks reach stderr
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
    """A long-running ``starter.py follow`` whose output is read line by line while it runs.

    Both streams are drained by tasks from the start, so everything the process printed is kept, even when
    a wait times out (``communicate()`` under a timeout would drop what it had read)."""

    def __init__(self, proc: asyncio.subprocess.Process):
        self.proc = proc
        self.lines: list[str] = []
        self.err = ""
        self._seen = 0  # lines already offered to a read_until predicate
        self._more = asyncio.Condition()
        self._eof = False
        self._pumps = [asyncio.ensure_future(self._pump_out()), asyncio.ensure_future(self._pump_err())]

    @classmethod
    async def start(cls, config_path: Path, *args: str) -> Follower:
        return cls(await _spawn(config_path, *args))

    async def _pump_out(self) -> None:
        try:
            while raw := await self.proc.stdout.readline():
                async with self._more:
                    self.lines.append(raw.decode(errors="replace").rstrip("\n"))
                    self._more.notify_all()
        finally:
            async with self._more:
                self._eof = True
                self._more.notify_all()

    async def _pump_err(self) -> None:
        while chunk := await self.proc.stderr.read(4096):
            self.err += chunk.decode(errors="replace")

    async def read_until(self, predicate, timeout: float = 240.0) -> str:
        """Wait for an output line (not offered before) that satisfies ``predicate``; return it."""
        async def go():
            async with self._more:
                while True:
                    while self._seen < len(self.lines):
                        line = self.lines[self._seen]
                        self._seen += 1
                        if predicate(line):
                            return line
                    if self._eof:
                        raise AssertionError("follow ended before the expected line; output:\n" + self.output
                                             + "\nstderr:\n" + self.err)
                    await self._more.wait()
        try:
            return await asyncio.wait_for(go(), timeout)
        except TimeoutError:
            raise AssertionError(f"no expected line within {timeout:.0f}s; output:\n" + self.output
                                 + "\nstderr:\n" + self.err) from None

    async def interrupt(self, timeout: float = 30.0) -> int:
        """Ctrl-C, as an operator closing the terminal would; returns the exit code."""
        self.proc.send_signal(signal.SIGINT)
        return await self.finish(timeout)

    async def finish(self, timeout: float = 240.0) -> int:
        """Wait for the exit and the end of both streams; returns the exit code."""
        try:
            # the pumps are shielded: a timeout here must not cancel them, or the output read after the kill
            # below is lost and the CancelledError of the cancelled pumps hides this assertion (a clean-clone
            # CI run failed with a bare CancelledError where "follow did not end" and the stacks were due)
            await asyncio.wait_for(asyncio.gather(self.proc.wait(), *(asyncio.shield(p) for p in self._pumps)),
                                   timeout)
        except TimeoutError:
            signals = _signal_state(self.proc.pid)
            await _abort(self.proc)  # faulthandler prints every thread's stack on SIGABRT
            kill_group(self.proc)
            await self.proc.wait()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(asyncio.gather(*self._pumps), 5)
            raise AssertionError(f"follow did not end within {timeout:.0f}s; output:\n" + self.output
                                 + f"\nsignals: {signals}\nstderr:\n" + self.err) from None
        finally:
            _LIVE.discard(self.proc)
        return self.proc.returncode

    def stop(self) -> None:
        """Idempotent cleanup for a test that failed half-way."""
        if self.proc.returncode is None:
            kill_group(self.proc)
        for pump in self._pumps:
            pump.cancel()

    @property
    def output(self) -> str:
        return "\n".join(self.lines)


def _signal_state(pid: int) -> str:
    """The process's pending, blocked, ignored and caught signal masks (why a Ctrl-C went unanswered)."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError as e:
        return f"unreadable ({e})"
    return " ".join(line.replace("\t", "") for line in status.splitlines()
                    if line.startswith(("SigPnd", "ShdPnd", "SigBlk", "SigIgn", "SigCgt")))


async def _abort(proc, grace: float = 5.0) -> None:
    """SIGABRT and a bounded wait for the exit, so faulthandler writes the stacks before the group is killed."""
    try:
        proc.send_signal(signal.SIGABRT)
    except ProcessLookupError:
        return
    try:
        await asyncio.wait_for(proc.wait(), grace)
    except TimeoutError:
        pass


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
