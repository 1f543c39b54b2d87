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
LIVE_TICK_S = 5.0  # on a terminal, elapsed times tick at least this often
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


class Ticker:
    """Elapsed times that tick between changes. A target's ``progress.elapsed_s`` is what the watcher saw at
    its last change; while the job runs, the time since this terminal first saw that value is added (a
    value seen anew starts over; an ended job's time stays as reported)."""

    def __init__(self, clock: Callable[[], float] = time.monotonic):
        self.clock = clock
        self._seen: dict[str, tuple[tuple, float]] = {}

    def elapsed(self, key: str, p) -> float | None:
        if p is None:
            return None
        now, mark = self.clock(), (p.job_id, p.elapsed_s, p.state)
        seen = self._seen.get(key)
        if seen is None or seen[0] != mark:
            self._seen[key] = seen = (mark, now)
        return p.elapsed_s if p.terminal else p.elapsed_s + (now - seen[1])


def rows(rep: PipelineReport | None, statuses: dict[str, TargetStatus | None],
         ticker: Ticker | None = None) -> list[Row]:
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
        seconds = ticker.elapsed(key, p) if ticker is not None else (p.elapsed_s if p else None)
        out.append(Row(key, stage, job, _elapsed(seconds),
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


# What to do about a wait the service offers no command for (e.g. a red required check): never nothing.
NEXT_STEP = {
    "merge_checks": ("push a fix to the PR's branch (or re-run the failed check, or answer the requested "
                     "changes); the build waits and merges once the required checks are green and it is "
                     "authorized"),
    "step_retrying": "nothing to run: the step is retried with backoff (bounded); the build goes on by itself",
    "registry_drift": "restore the image the PR records at its tag (the report names it); the build waits",
}
DEFAULT_NEXT_STEP = "nothing to run yet: the build goes on by itself; `follow` shows each change"


def group_waits(reasons: list[WaitingReason]) -> list[tuple[list[str], WaitingReason]]:
    """Waits that differ only by their target, as one block: (targets, the first wait). Their detail and
    command are compared with the target's key taken out, so four targets waiting for the same package
    are one block with one command."""
    groups: dict[tuple, tuple[list[str], WaitingReason]] = {}
    for w in reasons:
        strip = (lambda t, w=w: t.replace(w.target, "\0")) if w.target else (lambda t: t)
        key = (w.kind, strip(w.detail), strip(w.command or ""), w.target is None)
        if key in groups and w.target:
            groups[key][0].append(w.target)
        else:
            groups[key if w.target else (*key, len(groups))] = ([w.target] if w.target else [], w)
    return list(groups.values())


OPERATOR_ENV = "GPU_RL_BUILDER_OPERATOR"
YOUR_NAME = "<your-name>"  # domain/outcome.py's placeholder in decide/approve-merge commands


def personal(command: str | None) -> str | None:
    """``command`` with ``--by <your-name>`` filled from $GPU_RL_BUILDER_OPERATOR when it is set, so the
    printed command runs as printed (``<your-name>`` is a shell redirection); unchanged otherwise."""
    import os
    import shlex

    login = os.environ.get(OPERATOR_ENV, "").strip()
    if not command or not login:
        return command
    return command.replace(YOUR_NAME, shlex.quote(login))


def _group_command(targets: list[str], w: WaitingReason) -> str | None:
    """The one command that unblocks every target of a group, runnable as printed: the wait's own for one
    target (or when it names no target), else a loop over the targets."""
    import shlex

    if not w.command or len(targets) <= 1 or w.target not in w.command:
        return w.command
    words = shlex.split(w.command)
    if w.target not in words:
        return w.command
    body = shlex.join(words).replace(shlex.quote(w.target), '"$t"')
    return f"for t in {' '.join(shlex.quote(t) for t in targets)}; do {body}; done"


def wait_lines(reasons: list[WaitingReason], width: int | None = None) -> list[str]:
    """What each wait needs and the command that unblocks it (identical waits of several targets grouped
    into one block, ``group_waits``). With ``width`` (a terminal) a command longer than a line is split between
    arguments with shell continuations (`` \\``), so it pastes and runs as it is and no id is ever broken;
    without (a log), one line each. A wait without a command says what to do instead."""
    out = []
    for targets, w in group_waits(reasons):
        who = f"{', '.join(targets)}: " if targets else ""
        detail = w.detail.replace(w.target, "each") if len(targets) > 1 and w.target else w.detail
        out.append(f"WAITING {who}{shorten(detail, 320)}")
        command = personal(_group_command(targets, w))
        if not command:
            out.append(f"  next: {NEXT_STEP.get(w.kind, DEFAULT_NEXT_STEP)}")
            continue
        command = printable(command)
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
        self._elapsed: tuple = ()
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
        head = Text(f"{wid} — {stage}  ({time.strftime('%H:%M:%S')})")
        return Group(head, t, *(Text(line) for line in wait_lines(reasons, width)))

    def note(self, line: str) -> None:
        self.live.console.print(line, markup=False, highlight=False)

    def due_in(self) -> float:
        """The follow loop wakes at least this often, so elapsed times tick on screen."""
        return LIVE_TICK_S

    def update(self, wid: str, stage: str, table: list[Row], reasons: list[WaitingReason]) -> None:
        # A change is redrawn at most once a second; elapsed times alone (Ticker) every LIVE_TICK_S, so they
        # tick on screen without a redraw per poll.
        shown = (wid, stage, tuple((r.target, r.stage, r.job, r.marker, r.waiting) for r in table),
                 tuple(wait_lines(reasons)))
        elapsed = tuple(r.elapsed for r in table)
        now = self.clock()
        if shown == self._shown and (elapsed == self._elapsed or now - self._drawn_at < LIVE_TICK_S):
            return
        if now - self._drawn_at < LIVE_MIN_REDRAW_S:
            return
        self._shown, self._elapsed, self._drawn_at = shown, elapsed, now
        self.redraws += 1
        self.live.update(self.render(wid, stage, table, reasons), refresh=True)

    def close(self) -> None:
        self.live.stop()


def worker_note(previous: str | None, missing: str | None, answered: bool, task_queue: str
                ) -> tuple[str | None, str | None]:
    """(the line to print now or None, the "no worker" line now standing). "A worker is polling again" is
    said only on proof: a worker answered this round's query. A poller still listed is no proof (a killed
    worker's stays listed for minutes), nor is the end of a stalled-task sign."""
    if missing:
        return (missing if missing != previous else None), missing
    if previous and answered:
        return f"a worker is polling {task_queue} again (it answered the build's query)", None
    return None, previous


def summary_lines(rep: PipelineReport, width: int = 80) -> list[str]:
    """How a followed build ended, in 3-5 lines (outcome, PR, digests, next step), then where the full
    report is: ``gh run watch`` ends with a line, not the whole run."""
    wid = rep.workflow_id
    f = rep.failure
    pr = rep.pull_request
    merged = rep.merge_commit or (pr.merge_commit if pr else None)
    out = [shorten(f"{rep.status}: {wid}" + (f" — {f.failure_class}: {f.message}" if f else "")
                   + (f" — merge commit {merged[:12]}" if merged else ""), width)]
    if pr:  # the URL whole (a terminal makes it clickable): on its own line
        out.append(f"PR #{pr.number} {pr.url}" + ("" if pr.merged else f" ({pr.state})"))
    digests = [f"{t.key} {t.digest[:19]}" for t in rep.targets if t.digest]
    if digests:
        line = "images:"
        for d in digests:  # at most two lines of digests; the report has every one in full
            if len(line) + 2 + len(d) > width and len(out) < 3:
                out.append(line.rstrip(","))
                line = " "
            line += f" {d},"
        out.append(shorten(line.rstrip(","), width))
    if f:
        out.append(shorten(f"next step: {f.next_step}", 3 * width))
    elif rep.waiting:
        w = rep.waiting[0]
        out.append(shorten(f"next step: {personal(w.command) or NEXT_STEP.get(w.kind, DEFAULT_NEXT_STEP)}", 3 * width))
    elif rep.status == "merged":
        out.append("next step: nothing; the digests are pinned on the default branch")
    out.append(f"full report: python starter.py report {wid}")
    return out
