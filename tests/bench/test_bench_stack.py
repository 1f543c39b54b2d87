"""bench/_stack.py: a bench attached to a stack that is not there, or not whole, stops at once naming
``--stack`` and the file, before it starts anything (no GitHub stand-in, no remotes left behind)."""

from __future__ import annotations

import json

import pytest

from bench._stack import AttachedStack


def test_a_missing_stack_json_is_refused_naming_the_flag_and_file(tmp_path):
    with pytest.raises(SystemExit, match=r"--stack .*nowhere\.json: not a readable sandbox stack\.json"):
        AttachedStack(tmp_path / "nowhere.json", tmp_path / "state", "x")
    assert not (tmp_path / "state").exists()


def test_a_stack_without_the_token_registry_admin_endpoint_is_refused(tmp_path):
    config = tmp_path / "config.toml"
    config.write_text('work_dir = "/tmp"\n')
    part = {"url": "http://127.0.0.1:1", "host": "127.0.0.1:1", "pid": 1}
    (tmp_path / "stack.json").write_text(json.dumps({
        "config": str(config), "temporal": {"address": "127.0.0.1:1", "namespace": "default", "pid": 1},
        "iris": {"url": "http://127.0.0.1:1", "pid": 1}, "registry_open": part, "registry_token": part}))
    with pytest.raises(SystemExit, match=r"--stack .*stack\.json: needs temporal, iris and both registries"):
        AttachedStack(tmp_path / "stack.json", tmp_path / "state", "x")
    assert not (tmp_path / "state").exists()
