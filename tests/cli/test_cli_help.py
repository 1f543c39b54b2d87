"""Every command's ``--help`` works and names its options; usage errors exit 2 before touching a service."""

from __future__ import annotations

import pytest
from click.testing import CliRunner

from starter import cli

COMMANDS = {
    (): ["--config", "build", "follow", "status", "report", "approve-merge", "decide", "recheck", "cancel",
         "schedule", "logs", "evidence"],
    ("build",): ["--arch", "--variant", "--requested-by", "--reason", "--cluster", "--priority", "--harbor-ref",
                 "--push-floating", "--plan", "--follow", "--json"],
    ("follow",): ["WORKFLOW_ID", "--interval"],
    ("status",): ["--query", "--limit", "--all", "--json"],
    ("report",): ["WORKFLOW_ID", "--format", "markdown", "json"],
    ("approve-merge",): ["WORKFLOW_ID", "--by", "--note"],
    ("decide",): ["WORKFLOW_ID", "TARGET", "retry", "abort", "--by"],
    ("recheck",): ["WORKFLOW_ID", "TARGET"],
    ("cancel",): ["WORKFLOW_ID"],
    ("resume",): ["WORKFLOW_ID", "--follow", "--json"],
    ("logs",): ["WORKFLOW_ID", "TARGET", "--full"],
    ("evidence",): ["WORKFLOW_ID", "--download", "--json"],
    ("schedule",): ["create", "list", "describe", "pause", "unpause", "trigger", "delete"],
    ("schedule", "create"): ["SCHEDULE_ID", "--every", "--cron", "--arch", "--requested-by", "--reason"],
    ("schedule", "list"): ["--json"],
    ("schedule", "describe"): ["SCHEDULE_ID", "--json"],
    ("schedule", "pause"): ["SCHEDULE_ID"],
    ("schedule", "unpause"): ["SCHEDULE_ID"],
    ("schedule", "trigger"): ["SCHEDULE_ID"],
    ("schedule", "delete"): ["SCHEDULE_ID"],
}


@pytest.mark.parametrize("command", list(COMMANDS), ids=lambda c: " ".join(c) or "cli")
def test_help_exits_0_and_names_the_options(command):
    result = CliRunner().invoke(cli, [*command, "--help"], obj={})
    assert result.exit_code == 0, result.output
    assert "Usage:" in result.output
    missing = [word for word in COMMANDS[command] if word not in result.output]
    assert not missing, f"{' '.join(command)} --help does not mention {missing}:\n{result.output}"


def test_every_command_is_covered_by_the_help_test():
    """A new command without a help test fails here."""
    names = {(n,) for n in cli.commands} | {("schedule", n) for n in cli.commands["schedule"].commands}
    assert names <= set(COMMANDS)


@pytest.mark.parametrize("args", [
    ["build", "--arch", "amd64"],
    ["build", "--arch", "amd64", "--requested-by", "me"],
    ["build", "--arch", "amd64", "--reason", "issue 1"],
])
def test_build_without_an_explicit_request_is_a_usage_error(args):
    # No --config at all: the refusal must come before any configuration or service is needed.
    result = CliRunner().invoke(cli, args, obj={})
    assert result.exit_code == 2
    assert "--requested-by" in result.output and "--reason" in result.output


@pytest.mark.parametrize("timing", [[], ["--every", "24", "--cron", "0 2 * * *"]])
def test_schedule_create_needs_exactly_one_of_every_or_cron(timing):
    result = CliRunner().invoke(cli, ["schedule", "create", "s1", *timing, "--arch", "amd64",
                                      "--requested-by", "me", "--reason", "r"], obj={})
    assert result.exit_code == 2
    assert "exactly one of --every or --cron" in result.output


def test_build_cluster_override_must_be_arch_equals_cluster():
    result = CliRunner().invoke(cli, ["build", "--arch", "amd64", "--requested-by", "me", "--reason", "r",
                                      "--cluster", "sandbox-amd64"], obj={})
    assert result.exit_code == 2
    assert "expected ARCH=CLUSTER" in result.output
