"""deploy/README.md stays runnable: every gpu-rl-builder command it shows parses with the real CLI, and
every repository file it names exists."""

from __future__ import annotations

import re
import shlex
import warnings
from pathlib import Path

import click
import pytest

from runtime.namespace_setup import main as setup_namespace
from starter import cli as starter_cli
from worker import main as worker_main

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "deploy" / "README.md"
COMMANDS = {"gpu-rl-builder": starter_cli, "gpu-rl-builder-worker": worker_main,
            "gpu-rl-builder-setup-namespace": setup_namespace}


def _shell_commands() -> list[list[str]]:
    commands = []
    for block in re.findall(r"```sh\n(.*?)```", README.read_text(), re.S):
        text = re.sub(r"\\\n\s*", " ", block)
        for line in text.splitlines():
            line = line.split(" #", 1)[0].strip()
            if line and not line.startswith("#"):
                commands.append(shlex.split(line.replace("&", " ")))
    return commands


def _parse(command: click.Command, name: str, args: list[str], parent=None) -> None:
    if "--help" in args:  # the installed entry points' --help is run by test_wheel
        return
    ctx = command.make_context(name, list(args), parent=parent)
    if isinstance(command, click.Group):
        with warnings.catch_warnings():  # Click 8.2 deprecates protected_args; Click 9 puts them in args
            warnings.simplefilter("ignore", DeprecationWarning)
            rest = [*ctx.protected_args, *ctx.args]
        assert rest, f"{name}: no subcommand"
        sub = command.get_command(ctx, rest[0])
        assert sub is not None, f"{name}: unknown subcommand {rest[0]!r}"
        _parse(sub, rest[0], rest[1:], ctx)


def test_readme_shows_every_step_and_each_cli_command_parses():
    commands = _shell_commands()
    ran = 0
    for argv in commands:
        while argv and re.fullmatch(r"[A-Z_]+=.*", argv[0]):
            argv = argv[1:]  # VAR=value prefixes
        if argv and argv[0] in COMMANDS:
            _parse(COMMANDS[argv[0]], argv[0], argv[1:])
            ran += 1
    assert ran >= 8
    heads = {a[0] for a in commands if a}
    assert {"helm", "kubectl", "docker", "tcld", "gpu-rl-builder-setup-namespace", "pip"} <= heads


def test_a_wrong_flag_in_the_readme_would_be_caught():
    with pytest.raises(click.UsageError):
        _parse(starter_cli, "gpu-rl-builder", ["--profil", "cloud", "status"])


def test_every_repository_path_named_exists():
    paths = set(re.findall(r"`((?:deploy|docker|docs|runtime)/[\w./-]+)`", README.read_text()))
    paths |= set(re.findall(r"(?<![\w/])((?:deploy|docker)/[\w./-]+\.(?:yaml|toml|py|txt))", README.read_text()))
    assert len(paths) >= 8
    missing = sorted(p for p in paths if not (ROOT / p.rstrip(".")).exists())
    assert not missing, missing
