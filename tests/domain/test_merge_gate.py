"""The merge gate's pure rules: the required set and its fallbacks, the verdict over required checks only
(optional failures shown, never blocking; overrides), reviewers' standing, the /approve-merge command."""

from __future__ import annotations

from domain.merge_gate import fold, is_approve_command, required_set, standing, verdict


def test_github_answer_wins_and_names_its_sources():
    req = required_set(["ci"], ["build / lint"], ["configured"])
    assert req.names == ["build / lint", "ci"] and req.source == "github:branch-protection+github:rulesets"
    assert not req.all_reported


def test_unreadable_protection_falls_back_to_configuration_and_says_why():
    req = required_set(None, [], ["ci"], unreadable="branch protection of main unreadable (403 ...)")
    assert req.names == ["ci"] and req.source == "config:github.required_checks"
    assert "403" in req.note


def test_nothing_required_anywhere_means_every_reported_check_is_required():
    req = required_set([], [], [])
    assert req.all_reported and "every reported check is required" in req.note
    assert verdict({}, req).state == "pending"  # absence of CI is never success
    assert verdict({"lint": "failure", "ci": "success"}, req).failing == ["lint"]


def test_only_required_checks_block_and_optional_failures_are_shown():
    req = required_set(["ci"], None, [])
    v = verdict({"ci": "success", "lint": "failure"}, req)
    assert (v.state, v.failing, v.optional_failing) == ("success", [], ["lint"])
    v = verdict({"ci": "failure", "lint": "success"}, req)
    assert (v.state, v.failing) == ("failure", ["ci"])
    v = verdict({"lint": "success"}, req)
    assert (v.state, v.pending) == ("pending", ["ci"])  # required but not reported yet


def test_an_override_removes_only_the_named_required_check():
    req = required_set(["ci", "e2e"], None, [])
    v = verdict({"ci": "failure", "e2e": "success"}, req, overrides=["ci"])
    assert (v.state, v.overridden) == ("success", ["ci"])
    v = verdict({"ci": "failure", "e2e": "failure"}, req, overrides=["ci", "nope"])
    assert (v.state, v.failing, v.overridden) == ("failure", ["e2e"], ["ci"])


def test_the_worst_report_of_a_name_wins():
    assert fold([("ci", "success"), ("ci", "failure"), ("ci", "pending")]) == {"ci": "failure"}
    assert fold([("ci", "success"), ("ci", "pending")]) == {"ci": "pending"}


def test_a_comment_after_changes_requested_leaves_the_request_standing():
    latest = standing([("Ana", "CHANGES_REQUESTED", "a"), ("ana", "COMMENTED", "a"), ("bob", "APPROVED", "a"),
                       ("bob", "DISMISSED", "a"), ("eve", "PENDING", "a")])
    assert {k: v[1] for k, v in latest.items()} == {"ana": "CHANGES_REQUESTED", "bob": "DISMISSED"}


def test_approve_command_is_the_first_line_only():
    assert is_approve_command("/approve-merge")
    assert is_approve_command("\n  /Approve-Merge  looks good\nmore")
    assert not is_approve_command("please /approve-merge")
    assert not is_approve_command("/approve-merged")
    assert not is_approve_command("")
