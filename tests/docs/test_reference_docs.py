"""The generated reference docs are current and complete: the committed files equal what
``scripts/gen-docs`` writes; every configuration key has a description; deploy/config.example.toml
names exactly the model's keys (set, or shown commented out)."""

from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import BaseModel, Field

from domain import config_reference as ref
from domain.reference_docs import GENERATED

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "deploy" / "config.example.toml"


@pytest.mark.parametrize("rel", sorted(GENERATED))
def test_the_committed_doc_is_what_the_generator_writes(rel):
    path = ROOT / rel
    assert path.exists(), f"{rel} is missing: run scripts/gen-docs"
    assert path.read_text() == GENERATED[rel](), f"{rel} is stale: run scripts/gen-docs and commit it"


def test_every_configuration_key_has_a_description():
    assert ref.undocumented() == [], "add Field(description=...) in domain/config.py, then run scripts/gen-docs"


def test_the_example_names_every_key_of_the_model_and_no_other():
    shown, unknown = ref.example_keys(EXAMPLE.read_text())
    assert unknown == set(), f"{EXAMPLE.name} names keys the model does not have"
    missing = ref.model_keys() - shown
    assert missing == set(), f"{EXAMPLE.name} lacks these keys (set them, or show them commented out: `# key = …`)"


def test_the_reference_lists_every_key_with_type_default_and_description():
    text = (ROOT / "docs" / "configuration.md").read_text()
    for key in ("work_dir", "address", "image_repository", "retry_budget", "glob", "kind"):
        assert f"| `{key}` |" in text
    assert "## `[clusters.<name>.port_forward]`" in text and "## `[build.deploy_boundary[]]`" in text
    assert '| `task_queue` | string | `"gpu-rl-builder"` | The task queue' in text


class _Inner(BaseModel):
    port: int = Field(1, description="a port")


class _Outer(BaseModel):
    """Outer."""

    name: str = Field(description="a name")
    hosts: dict[str, _Inner] = Field(default_factory=dict, description="by name")
    rules: list[_Inner] = Field(default_factory=list, description="rules")
    env: dict[str, str] = Field(default_factory=dict, description="env")
    later: int | None = None  # a key added without a description


def test_a_new_key_is_picked_up_and_one_without_a_description_is_named():
    assert ref.model_keys(_Outer) == {"name", "hosts.<name>.port", "rules[].port", "env", "later"}
    assert ref.undocumented(_Outer)[0] == "later"
    text = ref.configuration_markdown(_Outer)
    assert "| `later` | integer | unset |  |" in text and "## `[hosts.<name>]`" in text


def test_keys_in_an_example_are_named_as_the_model_names_them():
    text = """name = "x"
[hosts.a]
port = 2
# [hosts.b]
# port = 3
# bogus = 1
[env]
A = "1"
"""
    shown, unknown = ref.example_keys(text, _Outer)
    assert shown == {"name", "hosts.<name>.port", "env"} and unknown == {"hosts.b.bogus"}
    assert ref.normalize(["clusters", "cw", "token", "kind"]) == "clusters.<name>.token"
    assert ref.normalize(["build", "deploy_boundary", "glob"]) == "build.deploy_boundary[].glob"
    assert ref.normalize(["policy", "retry_budget", "oom"]) == "policy.retry_budget"
    assert ref.normalize(["nope"]) is None
