"""``redact`` called again from inside its own rebuild returns instead of waiting for itself.

Why: a clean-clone CI run hung for good (pytest-timeout's alarm could not break it) in a workflow test: an
activity's log line made ``redact`` rebuild its automaton (``_current`` -> ``_build``), an allocation there
ran the garbage collector, a finalizer logged (asyncio's ``call_exception_handler``), and that log line's
``redact`` waited for the lock its own thread held. Here the finalizer is a real object in a reference
cycle collected in the middle of ``_build``; on the old code (``threading.Lock``) the thread never returns.
"""

from __future__ import annotations

import gc
import secrets
import threading

import domain.redact as redact_mod
from domain.redact import REDACTED, redact, register_secret


class _LogsWhenCollected:
    """Stands for what a finalizer does: asyncio's destroyed-pending-task report, logged (so redacted)."""

    def __init__(self, secret: str, seen: list[str]) -> None:
        self.cycle = self
        self.secret, self.seen = secret, seen

    def __del__(self) -> None:
        self.seen.append(redact(f"Task was destroyed but it is pending! token={self.secret}"))


def test_a_finalizer_that_logs_during_the_rebuild_does_not_hang_and_is_still_redacted(monkeypatch):
    first, second = f"first-{secrets.token_hex(12)}", f"second-{secrets.token_hex(12)}"
    register_secret(first)
    seen: list[str] = []
    real_anchors = redact_mod._anchors
    fired = []

    def anchors_with_a_collection(form: str):
        if not fired:  # once, in the middle of the rebuild _current started
            fired.append(True)
            _LogsWhenCollected(first, seen)  # unreachable at once: only the collector frees it
            gc.collect()
        return real_anchors(form)

    monkeypatch.setattr(redact_mod, "_anchors", anchors_with_a_collection)
    register_secret(second)  # the automaton is stale: the next redact rebuilds it
    out: list[str] = []
    t = threading.Thread(target=lambda: out.append(redact(f"log line with {second}")), daemon=True)
    t.start()
    t.join(20)
    assert not t.is_alive(), "redact waited for itself: a nested call from inside the rebuild deadlocked"
    assert fired and seen, "the finalizer did not run inside the rebuild: the test proves nothing"
    assert out == [f"log line with {REDACTED}"], out
    assert first not in seen[0] and REDACTED in seen[0], seen
    assert redact(f"{first} {second}") == f"{REDACTED} {REDACTED}"
