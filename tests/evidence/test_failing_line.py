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
    assert failing_line(KANIKO) == ("error building image: error building stage: failed to execute command: "
                                    "waiting for process to exit: exit status 3")


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
    assert marked[0] == 104 and "exit status 3" in marked[1]
    assert [r[0] for r in rows] == list(range(99, 106))  # the log ends at 105
    assert failing_line_index(text.splitlines()) == 103


def test_a_very_long_failing_line_is_shortened_for_history():
    assert len(failing_line("error building image: " + "x" * 5000)) == 300
