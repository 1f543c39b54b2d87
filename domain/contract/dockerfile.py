"""Parse a GPU-RL Dockerfile into pins, stages, labels and the log markers its RUN steps echo.

Why: the pins (`ARG X=default` before the first FROM) are what the build script checks and what a
Harbor move edits; the LABELs are what validation compares; the echoed lines are the assertion
markers a successful build log must show. Unknown instructions fail closed.
"""

from __future__ import annotations

import re
import shlex

from domain.contract.errors import ContractError
from domain.contract.models import DockerfileContract, EchoLine, Stage
from domain.contract.shell import echo_text, walk

_KNOWN = {"FROM", "ARG", "ENV", "LABEL", "RUN", "COPY", "ADD", "WORKDIR", "USER", "SHELL", "ENTRYPOINT",
          "CMD", "EXPOSE", "VOLUME", "STOPSIGNAL", "HEALTHCHECK", "ONBUILD"}
_LAYER = {"RUN", "COPY", "ADD"}


def _instructions(text: str) -> list[tuple[int, str, str]]:
    """(line, INSTRUCTION, rest) with `\\` continuations joined (comment lines inside are skipped)."""
    out: list[tuple[int, str, str]] = []
    lines = text.splitlines()
    i = 0
    while i < len(lines):
        raw = lines[i]
        start = i + 1
        i += 1
        if not raw.strip() or raw.lstrip().startswith("#"):
            continue
        parts = [raw.rstrip()]
        while parts[-1].endswith("\\") and i < len(lines):
            parts[-1] = parts[-1][:-1]
            nxt = lines[i]
            i += 1
            if nxt.lstrip().startswith("#"):
                parts.append("\\")
                continue
            parts.append(nxt.rstrip())
        joined = "\n".join(p for p in parts if p != "\\")
        m = re.match(r"^\s*([A-Za-z]+)\s*(.*)$", joined, re.S)
        if not m:
            raise ContractError("", start, "a Dockerfile instruction", raw.strip())
        out.append((start, m.group(1).upper(), m.group(2).strip()))
    return out


def _arg(rest: str) -> tuple[str, str | None]:
    m = re.fullmatch(r"([A-Za-z_][A-Za-z0-9_]*)(?:=(.*))?", rest.strip(), re.S)
    if not m:
        raise ValueError(rest)
    value = m.group(2)
    if value is not None and len(value) >= 2 and value[0] == value[-1] and value[0] in "'\"":
        value = value[1:-1]
    return m.group(1), value


def parse_dockerfile(text: str, path: str) -> DockerfileContract:
    pins: dict[str, str] = {}
    global_args: dict[str, str | None] = {}
    stages: list[Stage] = []
    for line, ins, rest in _instructions(text):
        if ins not in _KNOWN:
            raise ContractError(path, line, "a Dockerfile instruction", ins)
        if ins == "FROM":
            m = re.fullmatch(r"(?:--platform=\S+\s+)?(\S+)(?:\s+[Aa][Ss]\s+([A-Za-z0-9_.-]+))?", rest)
            if not m or not m.group(2):
                raise ContractError(path, line, "`FROM <image|stage> AS <name>`", rest)
            base = m.group(1)
            names = {s.name for s in stages}
            stages.append(Stage(name=m.group(2), base=base, base_is_stage=base in names, line=line))
            continue
        if ins == "ARG":
            try:
                name, value = _arg(rest)
            except ValueError:
                raise ContractError(path, line, "`ARG NAME` or `ARG NAME=default`", rest) from None
            if not stages:
                global_args[name] = value
                if value is not None:
                    pins[name] = value
            else:
                stages[-1].args[name] = value
            continue
        if not stages:
            raise ContractError(path, line, "only ARG before the first FROM", ins)
        stage = stages[-1]
        if ins == "LABEL":
            try:
                pairs = shlex.split(rest, posix=True)
            except ValueError:
                raise ContractError(path, line, "LABEL key=value pairs", rest) from None
            for pair in pairs:
                key, sep, value = pair.partition("=")
                if not sep:
                    raise ContractError(path, line, "LABEL key=value", pair)
                stage.labels[key] = value
        elif ins in _LAYER:
            stage.layer_steps += 1
            if ins == "RUN":
                stage.echoes.extend(_run_echoes(rest, line, stage.name))
    if not stages:
        raise ContractError(path, 0, "at least one `FROM ... AS <stage>`")
    return DockerfileContract(path=path, pins=pins, global_args=global_args, stages=stages)


def _run_echoes(command: str, line: int, stage: str) -> list[EchoLine]:
    if command.startswith("["):
        return []  # exec form: no shell, no markers
    command = re.sub(r"^(--[a-z]+=\S+\s+)+", "", command)  # RUN --mount=... flags
    out = []
    for c in walk([(line, command)]):
        text = echo_text(c.text)
        if text is not None:
            out.append(EchoLine(template=text, guards=c.guards, in_loop=c.in_loop, stage=stage, line=line))
    return out
