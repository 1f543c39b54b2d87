"""Known-slow tests first, spread over the xdist workers (tests/conftest.py ``pytest_collection_modifyitems``).

pytest-xdist's ``worksteal`` hands each worker one contiguous chunk of the collection (worker i: the
remaining tests // the workers left, in order) and an idle worker then steals the back half of the longest
queue. A 2-3 minute test that sits late in a chunk is never stolen (it is running, or it is the last one
left) and becomes the suite's tail: the other worker idles while it runs. Put at the head of the chunks
instead, the long tests run first, side by side, while stealing evens out the many short ones behind them.

The seconds are measured call + setup times on 2 cores (`bash .ci/run` ``--durations``, runs at fb71c47
and 1b849da, load 2-3; the larger of the two); only the order depends on them, never a result. A test
renamed or removed here is simply not moved (and one missing from a full collection is reported by
tests/test_schedule.py).

Not listed: a test whose time is a session fixture few tests share (tests/deploy's ``wheel_venv``, ~40 s of
pip installs): moved into the other worker's chunk it would make both workers build it.
"""

from __future__ import annotations

from collections.abc import Sequence

SLOW_S: dict[str, float] = {
    "tests/e2e/test_kill_matrix_e2e.py::test_worker_killed_in_every_step_resumes_within_a_minute_with_one_of_each_side_effect": 192,
    "tests/bench/test_bench_smoke.py::test_every_bench_runs_at_its_smoke_size_and_prints_its_table": 189,
    "tests/e2e/test_redaction_after_crash_e2e.py::test_evidence_written_after_a_worker_crash_is_redacted": 84,
    # measured 70 s at load 5-6 (one run, not by .ci/run)
    "tests/e2e/test_cached_rebuild_e2e.py::test_a_rebuild_from_the_cache_after_a_cancel_ends_cache_unproven_naming_the_cached_step": 70,
    "tests/iris/test_log_lag.py::test_push_marker_flushed_after_terminal_is_judged_validated_every_time": 41,
    "tests/sandbox/test_first_build.py::test_the_five_command_first_build_runs_as_written": 64,
    "tests/activities/test_watch_engine.py::test_5000_watched_jobs_stay_within_the_status_budget_listing_pages_included": 50,
    "tests/cli/test_cli_operate.py::test_operator_drives_one_build_end_to_end_through_the_cli": 49,
    "tests/workflows/test_validation_settle.py::test_a_30s_registry_503_during_validation_does_not_fail_the_target": 45,
    "tests/workflows/test_watch_registration.py::test_200_targets_starting_together_register_without_a_timeout": 41,
    "tests/workflows/test_bounded_retry.py::test_github_unreachable_beyond_the_budget_ends_the_merge_wait_with_the_last_error": 38,
    "tests/iris/test_wrong_image.py::test_a_megatron_target_whose_image_lacks_megatron_never_validates": 37,
    "tests/e2e/test_merge_gate_e2e.py::test_a_red_required_check_waits_and_an_override_merges_with_its_reason_in_the_pr": 36,
    "tests/e2e/test_outside_actions_e2e.py::test_a_pr_closed_by_hand_ends_the_build_and_its_next_step_finishes_it_on_the_reopened_pr": 30,
    "tests/docs/test_iris_upgrade_doc.py::test_the_upgrade_docs_checks_run_and_pass": 28,
    "tests/cli/test_cli_follow_truth.py::test_follow_rides_out_a_temporal_restart_and_keeps_sdk_logs_off_the_terminal": 27,
    "tests/e2e/test_worker_crash_e2e.py::test_build_survives_worker_sigkill": 26,
    "tests/cli/test_cli_tables.py::test_status_and_schedules_answer_in_tables_and_text": 26,
    "tests/workflows/test_watcher_scale.py::test_a_stalled_watcher_is_replaced_and_the_end_still_delivered": 24,
    "tests/e2e/test_two_workers_e2e.py::test_two_workers_build_four_targets_with_every_side_effect_once": 23,
    "tests/workflows/test_watcher_markers.py::test_marker_texts_reach_a_watcher_run_once_per_contract_and_survive_continue_as_new": 23,
    "tests/e2e/test_upgrade_e2e.py::test_a_build_started_on_version_a_finishes_on_version_b": 22,
    "tests/workflows/test_cluster_watcher.py::test_follow_shows_the_watchers_live_progress_and_leases_the_fast_log_cadence": 21,
    "tests/e2e/test_resume_e2e.py::test_a_failure_in_recording_is_finished_by_the_suggested_command_without_rebuilding": 21,
    "tests/e2e/test_merge_gate_e2e.py::test_approval_while_pending_merges_on_green_past_an_optional_failure_and_a_read_only_block": 20,
    "tests/iris/test_log_evidence.py::test_a_lost_log_the_image_cannot_prove_ends_log_lost_with_its_next_step": 20,
}


# Never side by side (kept in one worker's chunk, one after the other): the bench smoke runs four benches at
# once, each with its own servers, and the kill matrix measures resume times against a 60 s bound.
APART: tuple[frozenset[str], ...] = (frozenset({
    "tests/e2e/test_kill_matrix_e2e.py::test_worker_killed_in_every_step_resumes_within_a_minute_with_one_of_each_side_effect",
    "tests/bench/test_bench_smoke.py::test_every_bench_runs_at_its_smoke_size_and_prints_its_table",
}),)


def chunk_sizes(n: int, workers: int) -> list[int]:
    """How many of ``n`` tests each worker gets first (xdist's WorkStealingScheduling.check_schedule)."""
    sizes, left = [], n
    for i in range(workers):
        sizes.append(left // (workers - i))
        left -= sizes[-1]
    return sizes


def order(ids: Sequence[str], workers: int, slow: dict[str, float] = SLOW_S,
          apart: tuple[frozenset[str], ...] = APART) -> list[int]:
    """The collection's new order (indices into ``ids``): each worker's chunk starts with its share of the
    known-slow tests, longest first (each goes to the chunk with the fewest slow seconds so far; an
    ``apart`` set goes to one chunk as a whole), then the other tests in their collection order."""
    known = [i for i, x in enumerate(ids) if x in slow]
    if not known:
        return list(range(len(ids)))
    # Units placed whole: an ``apart`` set (its members longest first), or one test.
    units: list[list[int]] = []
    for group in apart:
        members = sorted((i for i in known if ids[i] in group), key=lambda i: (-slow[ids[i]], i))
        if members:
            units.append(members)
    grouped = {i for u in units for i in u}
    units += [[i] for i in known if i not in grouped]
    units.sort(key=lambda u: (-sum(slow[ids[i]] for i in u), u[0]))
    rest = iter(i for i, x in enumerate(ids) if x not in slow)
    sizes = chunk_sizes(len(ids), max(1, workers))
    heads: list[list[int]] = [[] for _ in sizes]
    load = [0.0 for _ in sizes]
    for unit in units:
        room = [w for w in range(len(sizes)) if len(heads[w]) + len(unit) <= sizes[w]] or list(range(len(sizes)))
        w = min(room, key=lambda w: (load[w], w))
        heads[w] += unit
        load[w] += sum(slow[ids[i]] for i in unit)
    for h in heads:  # longest first within each chunk
        h.sort(key=lambda i: (-slow[ids[i]], i))
    out: list[int] = []
    for w, size in enumerate(sizes):
        out += heads[w]
        out += [i for _, i in zip(range(max(0, size - len(heads[w]))), rest, strict=False)]
    out += list(rest)
    return out
