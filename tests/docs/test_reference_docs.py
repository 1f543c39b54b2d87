"""The generated reference docs are current and complete: the committed files equal what
``scripts/gen-docs`` writes; every configuration key has a description; deploy/config.example.toml
names exactly the model's keys (set, or shown commented out); every failure class the code can report
(enum, boundary errors, literal ``failure_class=`` arguments anywhere), wait kind and stage has a
troubleshooting entry."""

from __future__ import annotations

import ast
import typing
from pathlib import Path

import pytest
from pydantic import BaseModel, Field
from temporalio.client import WorkflowExecutionStatus

from domain import config_reference as ref
from domain import outcome
from domain import troubleshooting as ts
from domain.config import PolicySettings
from domain.failures import FailureClass
from domain.models import Stage, WaitingReason
from domain.reference_docs import GENERATED
from runtime.exit_codes import EXIT_FAILED, EXIT_OK, EXIT_UNREACHABLE, EXIT_USAGE

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


# ----------------------------------------------------------------------------- troubleshooting
def _literal_failure_classes() -> set[str]:
    """Every string constant the code passes as a ``failure_class=`` argument (or its ``or`` fallback),
    so a class added in a workflow or activity is found without anyone listing it."""
    found = set()
    for folder in ("workflows", "activities", "domain", "runtime"):
        for path in (ROOT / folder).rglob("*.py"):
            for node in ast.walk(ast.parse(path.read_text())):
                if isinstance(node, ast.Call):
                    for kw in node.keywords:
                        if kw.arg == "failure_class":
                            found |= {c.value for c in ast.walk(kw.value)
                                      if isinstance(c, ast.Constant) and isinstance(c.value, str)}
    return found


def test_every_failure_class_wait_and_stage_has_a_troubleshooting_entry():
    documented = {e.name for e in ts.failure_classes()}
    in_code = ({str(c) for c in FailureClass} | {c for c, _ in outcome.BOUNDARY_FAILURES.values()}
               | {outcome.step_failure_class(t) for t in ("InputError", "StartToCloseTimeout", "SomethingElse")}
               | _literal_failure_classes()
               # runtime/operator_client.read_report: a run ended outside the service is named by its status
               | {s.name.lower() for s in (WorkflowExecutionStatus.TERMINATED, WorkflowExecutionStatus.TIMED_OUT)})
    assert in_code - documented == set(), "add an entry in domain/troubleshooting.py, then run scripts/gen-docs"
    assert {"visibility", "validation_inconclusive", "validation", "cancelled", "input"} <= in_code  # the scan works
    text = (ROOT / "docs" / "troubleshooting.md").read_text()
    for name in in_code:
        assert f"#### `{name}`" in text
    for kind in typing.get_args(WaitingReason.model_fields["kind"].annotation):
        assert f"### `{kind}`" in text
    for stage in Stage:
        assert f"| `{stage.value}` |" in text
    for code in (EXIT_OK, EXIT_FAILED, EXIT_USAGE, EXIT_UNREACHABLE):
        assert f"| {code} |" in text


def test_troubleshooting_takes_retries_and_commands_from_the_code():
    text = (ROOT / "docs" / "troubleshooting.md").read_text()
    budget = PolicySettings().retry_budget["preemption"]
    preemption = text.split("#### `preemption`")[1].split("####")[0]
    assert f"resubmitted automatically up to {budget} times" in preemption
    assert "never retried" in text.split("#### `input_error`")[1].split("####")[0]
    assert "waits for an operator" in text.split("#### `unknown`")[1].split("####")[0]
    visibility = text.split("### `package_visibility`")[1].split("###")[0]
    assert "`python starter.py recheck <workflow-id> <target>`" in visibility
    assert "`python starter.py decide <workflow-id> <target> retry --by <your-name>`" in text
