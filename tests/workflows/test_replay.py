"""Replay the committed histories (tests/histories/*.json) against today's workflow code.

A deploy must not break builds already running: if a change to workflows/ alters the command sequence
(adds, drops, reorders or renames an activity, timer or child), replay raises a non-determinism error
here. The tamper tests prove the check can fail: the same histories with one recorded command changed
must NOT replay clean.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from temporalio.client import WorkflowHistory
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.worker import Replayer

from tests.histories.generate import HISTORIES
from workflows.pipeline import BuildPipelineWorkflow
from workflows.target import TargetBuildWorkflow
from workflows.watcher import IrisWatcherWorkflow

HISTORY_DIR = Path(__file__).resolve().parents[1] / "histories"


def _replayer() -> Replayer:
    return Replayer(workflows=[BuildPipelineWorkflow, TargetBuildWorkflow, IrisWatcherWorkflow],
                    data_converter=pydantic_data_converter)


def _history(name: str, text: str | None = None) -> WorkflowHistory:
    return WorkflowHistory.from_json(HISTORIES[name], text or (HISTORY_DIR / name).read_text())


def test_every_committed_history_is_listed():
    assert sorted(p.name for p in HISTORY_DIR.glob("*.json")) == sorted(HISTORIES)


@pytest.mark.parametrize("name", sorted(HISTORIES))
async def test_history_replays_without_nondeterminism(name):
    history = _history(name)
    assert len(history.events) > 20  # a real run, not an empty file
    replayed = await _replayer().replay_workflow(history, raise_on_replay_failure=False)
    assert replayed.replay_failure is None, f"{name}: {replayed.replay_failure}"


def _events(name: str) -> tuple[dict, list[dict]]:
    doc = json.loads((HISTORY_DIR / name).read_text())
    return doc, doc["events"]


@pytest.mark.parametrize("name", sorted(HISTORIES))
async def test_a_renamed_activity_in_history_is_detected(name):
    """Stands for 'the workflow now schedules a different activity at this point'."""
    doc, events = _events(name)
    scheduled = [e for e in events if "activityTaskScheduledEventAttributes" in e]
    scheduled[1]["activityTaskScheduledEventAttributes"]["activityType"]["name"] += "_v0"
    replayed = await _replayer().replay_workflow(_history(name, json.dumps(doc)), raise_on_replay_failure=False)
    assert replayed.replay_failure is not None
    assert "nondetermin" in repr(replayed.replay_failure).lower()


async def test_a_dropped_child_start_in_pipeline_history_is_detected():
    """Stands for 'the pipeline no longer starts a child workflow per target'."""
    doc, events = _events("pipeline_success.json")
    doc["events"] = [e for e in events if not any(k.startswith(("startChildWorkflow", "childWorkflow"))
                                                  for k in e)]
    assert len(doc["events"]) < len(events)
    for i, e in enumerate(doc["events"], 1):  # keep event ids contiguous
        e["eventId"] = str(i)
    replayed = await _replayer().replay_workflow(_history("pipeline_success.json", json.dumps(doc)),
                                                 raise_on_replay_failure=False)
    assert replayed.replay_failure is not None
    assert "nondetermin" in repr(replayed.replay_failure).lower()


def _load_copy(tmp_path: Path, monkeypatch, module: str, edit=None):
    """Import a (possibly edited) copy of workflows/target.py under another module name."""
    source = (Path(__file__).resolve().parents[2] / "workflows" / "target.py").read_text()
    if edit:
        anchor, replacement = edit
        assert anchor in source, f"edit anchor {anchor!r} no longer in workflows/target.py; update this test"
        source = source.replace(anchor, replacement, 1)
    (tmp_path / f"{module}.py").write_text(source)
    monkeypatch.syspath_prepend(str(tmp_path))
    return __import__(module).TargetBuildWorkflow


ANCHOR = "        policy = await self._policy()\n"


async def test_an_edited_copy_of_the_target_workflow_fails_replay(tmp_path, monkeypatch):
    """The real thing the replay test guards against: one extra activity call before the first submit."""
    unchanged = _load_copy(tmp_path, monkeypatch, "target_copy_unchanged")
    edited = _load_copy(tmp_path, monkeypatch, "target_copy_edited",
                        (ANCHOR, ANCHOR + "        await self._policy()  # an added activity call\n"))
    for name in ("target_preempted_visibility.json", "target_operator_retry.json"):
        ok = await Replayer(workflows=[unchanged], data_converter=pydantic_data_converter).replay_workflow(
            _history(name), raise_on_replay_failure=False)
        assert ok.replay_failure is None, f"{name}: the unedited copy must replay clean: {ok.replay_failure}"
        bad = await Replayer(workflows=[edited], data_converter=pydantic_data_converter).replay_workflow(
            _history(name), raise_on_replay_failure=False)
        assert bad.replay_failure is not None and "nondetermin" in repr(bad.replay_failure).lower()


PATCH_GUARD = "        if workflow.patched(patches.EVIDENCE_MEMO):\n"
PRE_PATCH = "target_preempted_visibility.json"  # recorded before the evidence memo existed
POST_PATCH = "target_failed.json"  # recorded with it


def _has_patch_marker(name: str) -> bool:
    _, events = _events(name)
    return any("markerRecordedEventAttributes" in e for e in events)


async def test_the_evidence_memo_change_is_safe_only_because_it_is_patched(tmp_path, monkeypatch):
    """The rule of docs/versioning.md on a real change: the memo upsert replays against runs recorded
    before it only behind ``workflow.patched``; without the guard the same edit breaks them."""
    assert not _has_patch_marker(PRE_PATCH) and _has_patch_marker(POST_PATCH)
    unguarded = _load_copy(tmp_path, monkeypatch, "target_copy_unguarded", (PATCH_GUARD, "        if True:\n"))
    bad = await Replayer(workflows=[unguarded], data_converter=pydantic_data_converter).replay_workflow(
        _history(PRE_PATCH), raise_on_replay_failure=False)
    assert bad.replay_failure is not None and "nondetermin" in repr(bad.replay_failure).lower()
    for name in (PRE_PATCH, POST_PATCH):
        ok = await _replayer().replay_workflow(_history(name), raise_on_replay_failure=False)
        assert ok.replay_failure is None, f"{name}: {ok.replay_failure}"


async def test_a_worker_without_the_patch_cannot_take_over_a_patched_run(tmp_path, monkeypatch):
    """Why the rule forbids rolling back past a patch while patched runs are alive."""
    old = _load_copy(tmp_path, monkeypatch, "target_copy_before_patch",
                     (PATCH_GUARD + "            workflow.upsert_memo({\"evidence\": dict(self._evidence)})\n",
                      "        pass\n"))
    replayed = await Replayer(workflows=[old], data_converter=pydantic_data_converter).replay_workflow(
        _history(POST_PATCH), raise_on_replay_failure=False)
    assert replayed.replay_failure is not None
