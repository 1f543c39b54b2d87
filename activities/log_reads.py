"""A terminal job's log is read once per worker: a retried end-phase step reads only the lines after what it
already has, and nothing once the log was complete.

Why: ``check_build_log`` is retried while the log still arrives and while the registry gives no verdict on
the image that must stand in for lost lines; every attempt used to read the whole log from the start and
verify its seq gaps again (240-2,076 ``FetchLogs`` a minute per cluster at 200 targets, worker RSS 440 MiB;
issue 37). Kept on the worker's disk, not in memory (200 logs may end together), one JSON file per job
under ``<work_dir>/log-reads`` with the log store's cursor and the gap verification, written atomically;
lines are redacted before they are written (``domain.redact``), so the file holds nothing the evidence
store would not. Another worker (after a crash) has no file and reads the log once more; files older than
``MAX_AGE_S`` are removed as new ones are written.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import os
import re
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

from pydantic import BaseModel

from clients.iris import CompleteLog
from domain.log_evidence import LogIntegrity
from domain.redact import redact_lines

MAX_AGE_S = 6 * 3600.0
# Logs held in memory at once by one worker (read, judged, written as evidence): a 3,000-line log is ~7 MiB of
# entries, JSON and text while it is judged, and 200 targets ending together took a worker to 990 MiB RSS
# (bench/end_phase.py); the others wait here, heartbeating, for a slot (seconds each).
LOG_SLOTS = 16
CONTEXT_LINES = 16  # saved lines redacted again with a retry's new ones (a form across lines)


class SavedLog(BaseModel):
    job_id: str
    log: CompleteLog
    integrity: LogIntegrity | None = None
    requests: int = 0  # FetchLogs sent for this job by every attempt on this worker (reads + gap checks)


class LogReads:
    def __init__(self, root: Path, slots: int = LOG_SLOTS):
        self.root = root
        self.slots = slots
        self._sems: dict[asyncio.AbstractEventLoop, asyncio.Semaphore] = {}
        self.waiting = 0  # end phases waiting for a slot now (tests, benches)
        self.most_held = 0  # the most slots held at once so far
        self._held = 0

    @contextlib.asynccontextmanager
    async def slot(self):
        """Hold one of ``slots`` while a whole log is in memory: the worker's memory is bounded by the slots,
        not by the number of targets that end together."""
        loop = asyncio.get_running_loop()
        sem = self._sems.get(loop)
        if sem is None:
            sem = self._sems[loop] = asyncio.Semaphore(self.slots)
        self.waiting += 1
        try:
            await sem.acquire()
        finally:
            self.waiting -= 1
        self._held += 1
        self.most_held = max(self.most_held, self._held)
        try:
            yield
        finally:
            self._held -= 1
            sem.release()

    def path(self, job_id: str) -> Path:
        digest = hashlib.sha256(job_id.encode()).hexdigest()[:16]
        return self.root / f"{re.sub(r'[^A-Za-z0-9._-]+', '_', job_id).strip('_')[-80:]}-{digest}.json"

    def load(self, job_id: str) -> SavedLog | None:
        try:
            saved = SavedLog.model_validate_json(self.path(job_id).read_bytes())
        except (OSError, ValueError):
            return None
        return saved if saved.job_id == job_id else None

    def save(self, saved: SavedLog) -> None:
        self.root.mkdir(parents=True, exist_ok=True)
        path = self.path(saved.job_id)
        tmp = path.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(saved.model_dump_json())
        os.replace(tmp, path)
        self._prune()

    def _prune(self) -> None:
        cutoff = time.time() - MAX_AGE_S
        for p in self.root.glob("*.json"):
            try:
                if p.stat().st_mtime < cutoff:
                    p.unlink()
            except OSError:
                continue

    async def read(self, job_id: str, read: Callable[[CompleteLog | None], Awaitable[CompleteLog]]) -> SavedLog:
        """The job's log: ``read(start)`` is the store read (``IrisClient.read_complete_log`` with ``start``),
        given what an earlier attempt saved; new lines are redacted and the result saved."""
        saved = await asyncio.to_thread(self.load, job_id)
        start = saved.log if saved is not None else None
        log = await read(start)
        if log.reads == 0 and saved is not None:
            return saved
        known = len(start.entries) if start is not None else 0
        # Redacted together, with the last saved lines again (a token wrapped or dumped across lines is found
        # only whole; a retry's first new line may go on from the last saved one).
        lo = max(0, known - CONTEXT_LINES)
        fresh = redact_lines([e.data for e in log.entries[lo:]])
        entries = log.entries[:lo] + [e.model_copy(update={"data": d}) if d != e.data else e
                                      for e, d in zip(log.entries[lo:], fresh, strict=True)]
        out = SavedLog(job_id=job_id, log=log.model_copy(update={"entries": entries}),
                       integrity=saved.integrity if saved is not None and known == len(entries) else None,
                       requests=(saved.requests if saved is not None else 0) + log.reads)
        await asyncio.to_thread(self.save, out)
        return out

    async def integrity(self, saved: SavedLog,
                        verify: Callable[[CompleteLog], Awaitable[tuple[LogIntegrity, int]]]) -> LogIntegrity:
        """The log's gap verification, once: ``verify`` returns it with the requests it took."""
        if saved.integrity is not None:
            return saved.integrity
        integrity, requests = await verify(saved.log)
        saved.integrity, saved.requests = integrity, saved.requests + requests
        await asyncio.to_thread(self.save, saved)
        return integrity
