"""When the cluster watcher wakes a target: at once on a state change, rate-limited on progress, never on
an unknown state."""

from __future__ import annotations

from domain.models import JobProgress
from domain.watch import should_wake, user_prefix, watcher_id


def _p(state="running", **kw) -> JobProgress:
    return JobProgress(job_id="/u/j", state=state, terminal=state in ("succeeded", "failed", "missing"), **kw)


def test_a_state_change_wakes_at_once_even_right_after_a_wake_up():
    assert should_wake(_p("pending"), _p("running"), since_last_wake_s=0, progress_signal_s=600)
    assert should_wake(_p("running"), _p("succeeded"), since_last_wake_s=0, progress_signal_s=600)
    assert should_wake(_p(), _p("missing", missing=True), since_last_wake_s=0, progress_signal_s=600)


def test_progress_wakes_at_most_once_per_interval():
    known, now = _p(last_marker="step 1"), _p(last_marker="step 2")
    assert not should_wake(known, now, since_last_wake_s=599, progress_signal_s=600)
    assert should_wake(known, now, since_last_wake_s=600, progress_signal_s=600)
    assert should_wake(_p(preemptions=0), _p(preemptions=1), since_last_wake_s=900, progress_signal_s=600)


def test_nothing_new_or_nothing_known_never_wakes():
    assert not should_wake(_p(), _p(), since_last_wake_s=10**6, progress_signal_s=600)
    assert not should_wake(_p("pending"), _p("unknown", controller_reachable=False), since_last_wake_s=10**6,
                           progress_signal_s=600)


def test_an_unreachable_controller_is_progress_not_a_state_change():
    known, now = _p(), _p(controller_reachable=False, error="controller unreachable")
    assert not should_wake(known, now, since_last_wake_s=1, progress_signal_s=600)
    assert should_wake(known, now, since_last_wake_s=601, progress_signal_s=600)


def test_ids():
    assert watcher_id("cw-us-east-02a", "gpu-rl-builder") == "iris-watcher/gpu-rl-builder/cw-us-east-02a"
    assert watcher_id("c", "q1") != watcher_id("c", "q2")  # a queue only signals a watcher its workers run
    assert user_prefix("/gpu-rl-builder/build-amd64") == "/gpu-rl-builder/"
