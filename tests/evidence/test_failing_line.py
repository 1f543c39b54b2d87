"""The line a failure is quoted by, and the excerpt around it (pure)."""

from __future__ import annotations

from domain.evidence import excerpt, failing_line, failing_line_index

KANIKO = """\
[/u/job/0 stdout] INFO[0001] RUN pip install datasets
[/u/job/0 stderr] WARNING: Running pip as the 'root' user
[/u/job/0 stderr] datasets import failed
[/u/job/0 stderr] error building image: error building stage: failed to execute command: waiting for process to exit: exit status 3
[/u/job/0 stdout] cleaning up
"""


def test_the_hard_error_line_is_quoted_without_the_iris_prefix():
    assert failing_line("[t stdout] ok\n[t stderr] Traceback (most recent call last):\n[t stderr] x\n") == (
        "Traceback (most recent call last):")
    assert failing_line(KANIKO) == "datasets import failed"  # the cause above kaniko's wrapper line


def test_without_a_hard_signature_the_last_line_saying_failed_is_quoted():
    text = "[t stdout] step 1 ok\n[t stderr] download failed, giving up\n[t stdout] bye\n"
    assert failing_line(text) == "download failed, giving up"


def test_a_log_without_any_error_word_quotes_its_last_line_and_an_empty_log_nothing():
    assert failing_line("[t stdout] a\n[t stdout] Pushing image to r:t\n\n") == "Pushing image to r:t"
    assert failing_line("") is None and excerpt("") == []


def test_excerpt_marks_the_failing_line_with_its_line_number_and_keeps_context():
    text = "".join(f"[t stdout] line {i}\n" for i in range(100)) + KANIKO
    rows = excerpt(text, before=5, after=2)
    (marked,) = [r for r in rows if r[2]]
    assert marked[0] == 103 and "datasets import failed" in marked[1]
    assert [r[0] for r in rows] == list(range(98, 106))  # the log ends at 105
    assert failing_line_index(text.splitlines()) == 102


def test_a_very_long_failing_line_is_shortened_for_history():
    assert len(failing_line("error building image: " + "x" * 5000)) == 300


def test_kaniko_wrapper_line_quotes_the_cause_printed_above_it():
    """``error building image: … exit status 3`` only wraps the failed RUN (issue #17 item 7)."""
    assert failing_line(KANIKO_WRAPPED) == "ModuleNotFoundError: No module named 'megatron'"
    # The stand-in (and any RUN writing to stdout) prints the cause on stdout, the wrapper on stderr.
    other = ("[t stdout] INFO[0003] RUN python -c 'import x'\n[t stdout] x: no such module\n"
             "[t stderr] error building image: error building stage: failed to execute command: exit status 1\n")
    assert failing_line(other) == "x: no such module"
    # Iris orders stdout and stderr only by read batch: the cause may be stored after the wrapper.
    late = ("[t stdout] INFO[0003] RUN python -c 'import x'\n[t stderr] + exec kaniko\n"
            "[t stderr] error building image: error building stage: failed to execute command: exit status 1\n"
            "[t stdout] x: no such module\n")
    assert failing_line(late) == "x: no such module"
    # A wrapper with nothing above it is still quoted.
    assert failing_line(f"[t stderr] {WRAPPER}\n") == WRAPPER


WRAPPER = "error building image: error building stage: failed to execute command: exit status 3"
KANIKO_WRAPPED = f"""\
[/u/job/0 stdout] INFO[0001] RUN python -c 'import megatron'
[/u/job/0 stdout] step output
[/u/job/0 stderr] ModuleNotFoundError: No module named 'megatron'
[/u/job/0 stderr] INFO[0002] Taking snapshot of full filesystem...
[/u/job/0 stderr]
[/u/job/0 stderr] {WRAPPER}
[/u/job/0 stdout] cleaning up
"""
