"""Shared by tests/workflows/test_watcher_scale.py and bench/watcher_scale.py (a module of its own so the
workflow sandbox re-imports only this small file): a payload size recorder and a target stand-in."""

from __future__ import annotations

from temporalio import workflow
from temporalio.api.common.v1 import Payload
from temporalio.converter import PayloadCodec

with workflow.unsafe.imports_passed_through():
    from domain.models import JobProgress


class SizeRecorder(PayloadCodec):
    """Records the size of every payload encoded or decoded (passes them through unchanged)."""

    def __init__(self) -> None:
        self.largest = 0
        self.count = 0

    def _see(self, payloads) -> None:
        for p in payloads:
            self.count += 1
            self.largest = max(self.largest, p.ByteSize())

    async def encode(self, payloads: list[Payload]) -> list[Payload]:
        self._see(payloads)
        return list(payloads)

    async def decode(self, payloads: list[Payload]) -> list[Payload]:
        self._see(payloads)
        return list(payloads)


@workflow.defn
class EndReceiver:
    """Plays a target: waits for the watcher's ``job_changed`` with a terminal state."""

    def __init__(self) -> None:
        self.progress: JobProgress | None = None

    @workflow.signal
    def job_changed(self, progress: JobProgress) -> None:
        self.progress = progress

    @workflow.run
    async def run(self) -> JobProgress:
        await workflow.wait_condition(lambda: self.progress is not None and self.progress.terminal)
        return self.progress
