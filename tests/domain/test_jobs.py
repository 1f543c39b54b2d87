"""The job-name rule: every submission of every request generation has its own name, within 63 chars,
and the same submission always gets the same name (so a retried submit attaches)."""

from __future__ import annotations

from domain.jobs import MAX_JOB_NAME, generation_of, registry_has_our_image, submission_name
from domain.validation import CheckResult, ValidationReport

PLANNED = "gpurl-kaniko-amd64-standard-0123abcd"
LONG = "x" * 63


def test_same_submission_same_name_new_generation_or_round_new_name():
    gen = generation_of("01a22fbd-68db-7bb3-a9d9-4c0704b26167")
    assert gen == generation_of("01a22fbd-68db-7bb3-a9d9-4c0704b26167") and len(gen) == 8
    # UUIDv7 run ids of runs started in the same minute share their leading digits; generations do not.
    assert generation_of("01a22fbd-7000-7bb3-a9d9-4c0704b26168") != gen
    first = submission_name(PLANNED, generation=gen, round_=0)
    assert first == submission_name(PLANNED, generation=gen, round_=0) == f"{PLANNED}-{gen}"
    other_run = submission_name(PLANNED, generation=generation_of("01a22fbd-68db-7bb3-a9d9-4c0704b26168"), round_=0)
    resubmit = submission_name(PLANNED, generation=gen, round_=1)
    assert len({first, other_run, resubmit}) == 3
    assert resubmit == f"{PLANNED}-{gen}-r1"


def test_names_stay_within_the_limit_and_keep_their_suffixes():
    for round_ in (0, 1, 12):
        name = submission_name(LONG, generation="abcdef01", round_=round_)
        assert len(name) <= MAX_JOB_NAME and "-abcdef01" in name
        assert name.endswith(f"-r{round_}") == bool(round_)


def test_runs_recorded_before_generations_keep_their_names():
    assert submission_name(PLANNED, generation="", round_=0) == PLANNED
    assert submission_name(PLANNED, generation="", round_=2) == f"{PLANNED}-r2"


def _report(digest, verdicts) -> ValidationReport:
    checks = [CheckResult(name=f"label:l{i}", expected="a", observed="a", verdict=v) for i, v in enumerate(verdicts)]
    return ValidationReport(image_ref="r", tag="t", digest=digest, platform=None, layer_count=1,
                            largest_layer_bytes=1, total_bytes=1, anonymous_pull="pullable", labels={}, checks=checks)


def test_only_our_labelled_image_recovers_a_vanished_job():
    assert registry_has_our_image(_report("sha256:" + "a" * 64, ["pass", "pass"]))
    assert not registry_has_our_image(_report("sha256:" + "a" * 64, ["pass", "fail"]))
    assert not registry_has_our_image(_report("sha256:" + "a" * 64, []))  # no labels: absence never counts
    assert not registry_has_our_image(_report(None, ["pass"]))
