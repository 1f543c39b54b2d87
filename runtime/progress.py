"""Live build progress for ``starter.py follow`` / ``build --follow``, like ``gh run watch``.

A compact table (target, stage, job, elapsed, last marker, waiting for) redrawn in place with
``rich`` on a TTY; short plain lines otherwise (logs, pipes, tests), printed on change and at least
once a minute. Every wait is followed by the exact command that unblocks it. Why ``rich``: it owns
cursor movement and terminal width, so this module only says what to show.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from domain.models import PipelineReport, TargetStatus, WaitingReason
from domain.terminal_text import printable, shorten

HEARTBEAT_S = 45.0  # plain mode prints at least this often, even when nothing changes (promise: 60 s)
JOB_ID_WIDTH = 30  # a longer job id is shortened in the middle; its state is never cut
LIVE_MIN_REDRAW_S = 1.0  # the live table redraws on change only, at most once a second
LIVE_HEADERS = ("target", "stage", "job", "elapsed", "last marker", "waiting for")
LIVE_TABLE = {"show_edge": False, "pad_edge": False}  # four more columns of text on an 80-column terminal


@dataclass(frozen=True)
class Row:
    target: str
    stage: str
    job: str
    elapsed: str
    marker: str
    waiting: str


def _elapsed(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    s = int(seconds)
    return f"{s // 3600}h{s % 3600 // 60:02d}m" if s >= 3600 else f"{s // 60}m{s % 60:02d}s"


def rows(rep: PipelineReport | None, statuses: dict[str, TargetStatus | None]) -> list[Row]:
    out = []
    for key in [t.key for t in rep.plan] if rep and rep.plan else list(statuses):
        st = statuses.get(key)
        if st is None:
            out.append(Row(key, "not started", "-", "-", "-", ""))
            continue
        p = st.progress
        state = [f"({p.state})"] if p else []
        if p and p.preemptions:
            state.append(f"preempted×{p.preemptions}")
        if p and not p.controller_reachable:
            state.append("controller unreachable")
        # The id may be shortened (in the middle: its head names the build, its tail the round); the state
        # never is — it is what the operator reads the column for.
        job = " ".join([shorten_middle(st.job_ids[-1].rsplit("/", 1)[-1] if st.job_ids else "-", JOB_ID_WIDTH),
                        *state])
        stage = st.stage.value + (f" [{st.failure_class}]" if st.failure_class else "")
        out.append(Row(key, stage, job, _elapsed(p.elapsed_s if p else None),
                       shorten(p.last_marker if p else None, 40) or "-",
                       shorten(st.waiting.detail, 60) if st.waiting else ""))
    return out


def live_layout(table: list[Row], width: int) -> tuple[list[str], list[list[str]]]:
    """The live table's columns and cells at ``width``: the first layout that fits with the target uncut and
    no word split (``tables.fit_columns``). All six columns; else without ``waiting for`` (the WAITING
    lines under the table say it in full, with the command); else, for 80 columns, three columns whose
    cells stack the rest (stage / elapsed, job / last marker). Nothing is dropped but the repeated wait."""
    from runtime.tables import fit_columns

    def job(r: Row) -> str:  # id and state on their own lines: a narrow column wraps between them
        return r.job.replace(" ", "\n", 1)

    layouts = [
        (list(LIVE_HEADERS), [[r.target, r.stage, job(r), r.elapsed, r.marker, r.waiting] for r in table]),
        (list(LIVE_HEADERS[:5]), [[r.target, r.stage, job(r), r.elapsed, r.marker] for r in table]),
        (["target", "stage · elapsed", "job · last marker"],
         [[r.target, f"{r.stage.replace(' [', chr(10) + '[')}\n{r.elapsed}", f"{job(r)}\n{r.marker}"]
          for r in table]),
    ]
    for headers, cells in layouts:
        if fit_columns(headers, cells, width, foldable=("waiting for",), **LIVE_TABLE) is not None:
            return headers, cells
    return layouts[-1]  # narrower still: rich folds what must be folded


def shorten_middle(text: str, width: int) -> str:
    """``text`` at most ``width`` characters, cut in the middle (an ellipsis marks the cut)."""
    text = printable(text)
    if len(text) <= width:
        return text
    head = (width - 1) // 2
    return text[:head] + "…" + text[len(text) - (width - 1 - head):]


def waits(rep: PipelineReport | None, statuses: dict[str, TargetStatus | None]) -> list[WaitingReason]:
    found = [st.waiting for st in statuses.values() if st and st.waiting]
    known = {(w.kind, w.target) for w in found}
    found += [w for w in (rep.waiting if rep else []) if (w.kind, w.target) not in known]
    return found


async def decode_failures(client, pending: Iterable) -> list:
    """``pending`` activities with each last failure's message decoded: it travels as an encoded payload
    (runtime/payload_codec.py, encoded failure attributes), so the raw proto says only "Encoded failure"."""
    out = []
    for pa in pending:
        if pa.HasField("last_failure") and pa.last_failure.HasField("encoded_attributes"):
            copy = type(pa)()
            copy.CopyFrom(pa)
            try:
                err = await client.data_converter.decode_failure(copy.last_failure)
                copy.last_failure.message = str(getattr(err, "message", err))
            except Exception as e:  # noqa: BLE001 - a payload this starter cannot decode (no key): say so
                copy.last_failure.message = f"(cannot decode the error: {type(e).__name__}: {e})"
            pa = copy
        out.append(pa)
    return out


def retrying(pending: Iterable, target: str | None = None) -> list[WaitingReason]:
    """Steps Temporal is retrying (``describe().raw_description.pending_activities`` with a failed
    attempt): the step, its attempt and its last error, so a retry is never silent. The error text was
    redacted by the activity boundary (activities/errors.py) before it reached Temporal."""
    out = []
    for pa in pending:
        if pa.attempt <= 1 or not pa.HasField("last_failure"):
            continue
        out.append(WaitingReason(
            kind="step_retrying", target=target,
            detail=f"{pa.activity_type.name} failed (attempt {pa.attempt - 1}): "
                   f"{shorten(pa.last_failure.message, 200)}; retrying with backoff, bounded"))
    return out


def wait_lines(reasons: list[WaitingReason], width: int | None = None) -> list[str]:
    """What each wait needs and the command that unblocks it. With ``width`` (a terminal) a command longer
    than a line is split between arguments with shell continuations (`` \\``), so it pastes and runs as
    it is and no id is ever broken; without (a log), one line each."""
    out = []
    for w in reasons:
        who = f"{w.target}: " if w.target else ""
        out.append(f"WAITING {who}{shorten(w.detail, 160)}")
        if not w.command:
            continue
        command = printable(w.command)
        if width is None or len(command) + 7 <= width:
            out.append(f"  run: {command}")
        else:
            out += ["  run:", *(f"    {line}" for line in shell_lines(command, width - 4))]
    return out


def shell_lines(command: str, width: int) -> list[str]:
    """``command`` as lines of at most ``width`` characters joined by `` \\`` continuations, broken only
    between shell words: a quoted argument with spaces (``'it'"'"'s a reason'``) stays whole, as
    ``shlex.split`` decides (a run of space-separated pieces is one word once it splits as one)."""
    import shlex

    words: list[str] = []
    piece = ""
    for part in command.split(" "):
        piece = f"{piece} {part}" if piece else part
        try:
            whole = len(shlex.split(piece)) <= 1
        except ValueError:  # an open quote: the word goes on
            whole = False
        if whole and piece:
            words.append(piece)
            piece = ""
    if piece:
        words.append(piece)
    lines: list[str] = []
    line = ""
    for word in words:
        if line and len(line) + 1 + len(word) + 2 > width:
            lines.append(line + " \\")
            line = word
        else:
            line = f"{line} {word}" if line else word
    return [*lines, line]


class PlainView:
    """Short lines, on change and at least every HEARTBEAT_S seconds."""

    def __init__(self, echo: Callable[[str], None], clock: Callable[[], float] = time.monotonic):
        self.echo, self.clock = echo, clock
        self._last: dict[str, str] = {}
        self._head = ""
        self._printed_at = float("-inf")
        self._waits: list[str] = []

    def due_in(self) -> float:
        """Seconds until the next line is due even without a change (the follow loop wakes by then)."""
        return max(0.0, self._printed_at + HEARTBEAT_S - self.clock())

    def note(self, line: str) -> None:
        """A line about the service itself (reconnecting, no worker), printed at once."""
        self.echo(line)
        self._printed_at = self.clock()

    def update(self, wid: str, stage: str, table: list[Row], reasons: list[WaitingReason]) -> None:
        now = self.clock()
        beat = now - self._printed_at >= HEARTBEAT_S
        head = f"[{stage}] {wid}"
        lines = []
        if head != self._head or beat:
            lines.append(f"{head}  ({time.strftime('%H:%M:%S')})")
        for r in table:
            text = (f"  {r.target}: {r.stage} | job {r.job} | {r.elapsed} | marker {r.marker}"
                    + (f" | waiting: {r.waiting}" if r.waiting else ""))
            if self._last.get(r.target) != text or beat:
                lines.append(text)
                self._last[r.target] = text
        wl = wait_lines(reasons)
        if wl != self._waits or (beat and wl):
            lines += wl
            self._waits = wl
        if lines:
            self._head = head
            self._printed_at = now
            for line in lines:
                self.echo(line)

    def close(self) -> None:
        pass


class LiveView:
    """A table redrawn in place on a TTY (rich), with the unblocking commands under it."""

    def __init__(self, console=None, clock: Callable[[], float] = time.monotonic):
        from rich.console import Console
        from rich.live import Live

        self.console = console or Console()
        self.clock = clock
        # No auto refresh: the table is redrawn when what it shows changes, never on a timer.
        self.live = Live(console=self.console, transient=False, auto_refresh=False)
        self.live.start()
        self._shown: tuple | None = None
        self._drawn_at = float("-inf")
        self.redraws = 0

    def render(self, wid: str, stage: str, table: list[Row], reasons: list[WaitingReason]):
        """The build id on its own line (never inside the table, whose width could fold it), the table fitted
        to the terminal (``live_layout``), then each wait with its command."""
        from rich.console import Group
        from rich.text import Text

        from runtime.tables import rich_table

        width = self.console.width
        headers, cells = live_layout(table, width)
        t = rich_table(headers, cells, **LIVE_TABLE)
        head = Text(f"{wid} — {stage}  (changed {time.strftime('%H:%M:%S')})")
        return Group(head, t, *(Text(line) for line in wait_lines(reasons, width)))

    def note(self, line: str) -> None:
        self.live.console.print(line, markup=False, highlight=False)

    def update(self, wid: str, stage: str, table: list[Row], reasons: list[WaitingReason]) -> None:
        # Elapsed times tick every poll: they alone do not make a change worth a redraw.
        shown = (wid, stage, tuple((r.target, r.stage, r.job, r.marker, r.waiting) for r in table),
                 tuple(wait_lines(reasons)))
        now = self.clock()
        if shown == self._shown or now - self._drawn_at < LIVE_MIN_REDRAW_S:
            return
        self._shown, self._drawn_at = shown, now
        self.redraws += 1
        self.live.update(self.render(wid, stage, table, reasons), refresh=True)

    def close(self) -> None:
        self.live.stop()
