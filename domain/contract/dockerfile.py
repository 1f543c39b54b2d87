"""Read a GPU-RL Dockerfile into pins, stages, labels and the log markers its RUN steps print.

Why the `dockerfile` package: it wraps BuildKit's own Go parser (moby/buildkit
`frontend/dockerfile/parser`), so line continuations, comments inside continued lines, heredocs,
`--mount` flags, escape directives and JSON forms are read exactly as kaniko/BuildKit read them,
with each instruction's start and end line for provenance. A hand-written reader had to guess those
rules. Each RUN command is then read as bash (tree-sitter-bash, see shell.py) for the markers it
prints: `echo` lines and `python -c "...print(...)"` assertions, with the if/&& branch they sit in.

Why these fields: the pins (`ARG X=default` before the first FROM) are what the build script checks
and what a Harbor move edits; the LABELs are what validation compares; the printed lines are the
assertion markers a successful build log must show. An instruction we do not use is ignored.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

import dockerfile as bk

from domain.contract.errors import ContractError
from domain.contract.models import ArchSpec, CopyStep, DockerfileContract, EchoLine, ScriptContract, Stage
from domain.contract.shell import (
    command_args,
    command_name,
    descendants,
    if_clauses,
    parse_bash,
    printed_lines,
    src,
    statements,
)

_LAYER = {"RUN", "COPY", "ADD"}
# BuildKit's instruction set: the parser accepts any word, the builder (and kaniko) rejects the rest.
_INSTRUCTIONS = {"FROM", "ARG", "ENV", "LABEL", "RUN", "COPY", "ADD", "WORKDIR", "USER", "SHELL", "ENTRYPOINT",
                 "CMD", "EXPOSE", "VOLUME", "STOPSIGNAL", "HEALTHCHECK", "ONBUILD", "MAINTAINER"}


def _unquote(v: str) -> str:
    if len(v) >= 2 and v[0] == v[-1] and v[0] in "'\"":
        return v[1:-1]
    return v


def _args(values: tuple[str, ...]) -> list[tuple[str, str | None]]:
    out = []
    for item in values:
        name, sep, value = item.partition("=")
        out.append((name, _unquote(value) if sep else None))
    return out


def parse_dockerfile(text: str, path: str) -> DockerfileContract:
    try:
        commands = bk.parse_string(text)
    except bk.GoParseError as e:
        raise ContractError(path, 0, "a Dockerfile BuildKit can parse", str(e)) from None
    lines = text.splitlines()
    pins: dict[str, str] = {}
    pin_lines: dict[str, int] = {}
    global_args: dict[str, str | None] = {}
    stages: list[Stage] = []
    stage_env: dict[int, dict[str, str]] = {}
    run_texts: list[str] = []
    for c in commands:
        ins = c.cmd.upper()
        if ins not in _INSTRUCTIONS:
            raise ContractError(path, c.start_line, "a Dockerfile instruction (kaniko rejects any other)", c.cmd)
        if ins == "FROM":
            words = list(c.value)
            base = words[0] if words else ""
            name = words[2] if len(words) >= 3 and words[1].upper() == "AS" else str(len(stages))
            names = {s.name for s in stages}
            platform = next((f.partition("=")[2] for f in c.flags if f.startswith("--platform=")), None)
            stages.append(Stage(name=name, base=base, base_is_stage=base in names, line=c.start_line,
                                platform=_unquote(platform) if platform else None))
            continue
        if ins == "ARG":
            for name, value in _args(c.value):
                if not stages:
                    global_args[name] = value
                    if value is not None:
                        pins[name] = value
                        pin_lines[name] = c.start_line
                else:
                    stages[-1].args[name] = value
                    stages[-1].arg_lines[name] = c.start_line
            continue
        if not stages:
            continue  # a parser directive or instruction before FROM that we do not use
        stage = stages[-1]
        if ins == "ENV":  # COPY sources may use them (`COPY ${SRC}/x`): kept per stage, in order
            vals = list(c.value)
            env = stage_env.setdefault(len(stages) - 1, {})
            for key, value in zip(vals[0::2], vals[1::2], strict=False):
                env[key] = _unquote(value)
                stage.env_lines.setdefault(key, c.start_line)
        if ins == "LABEL":
            vals = list(c.value)
            for key, value in zip(vals[0::2], vals[1::2], strict=False):
                stage.labels[key] = _unquote(value)
        elif ins in _LAYER:
            stage.layer_steps += 1
            if ins in {"COPY", "ADD"}:
                stage.copies.append(_copy_step(ins, c, stage_env.get(len(stages) - 1, {})))
            if ins == "RUN":
                run_texts.append(c.original)
            if ins == "RUN" and not c.json:
                scripts = [h.content for h in c.heredocs] if c.heredocs else [" ".join(c.value)]
                for script in scripts:
                    stage.echoes.extend(_run_markers(script, c.start_line, c.end_line, lines, stage.name, path,
                                                     step=c.original.strip() if not c.heredocs else None))
    if not stages:
        raise ContractError(path, 0, "at least one `FROM ...`")
    for s in stages:
        for e in s.echoes:
            e.only_step = bool(e.source_text) and sum(e.source_text in t for t in run_texts) == 1
    return DockerfileContract(path=path, pins=pins, pin_lines=pin_lines, global_args=global_args, stages=stages)


def _copy_step(ins: str, c, env: Mapping[str, str] | None = None) -> CopyStep:
    frm = next((f.partition("=")[2] for f in c.flags if f.startswith("--from=")), None)
    words = [w for w in list(c.value)[:-1] if not w.startswith("<<")]  # the last word is the destination
    return CopyStep(instruction=ins, sources=[_unquote(w) for w in words], from_=frm or None, line=c.start_line,
                    env=dict(env or {}))


def _run_markers(command: str, start: int, end: int, lines: list[str], stage: str, path: str,
                 step: str | None = None) -> list[EchoLine]:
    """The lines a RUN step prints to the build log, each with the file line it is written on."""
    try:
        root = parse_bash(command, path, line_offset=start - 1)
    except ContractError:
        return []  # a RUN body we cannot read prints no marker we rely on; BuildKit runs it regardless
    final = {} if _may_end_early(root) else _final_commands(root)
    check = _is_check(root)
    out = []
    for s in statements(root):
        for p in printed_lines(s):
            at = next((i for i in range(start, end + 1) if i <= len(lines) and p.source_text[:40] in lines[i - 1]),
                      start)
            when = final.get(_span(s.node)) if command_name(s.node) == "echo" and not s.in_loop else None
            out.append(EchoLine(template=p.template, guards=s.guards, in_loop=s.in_loop, stage=stage, line=at,
                                source_text=p.source_text, step=step, must_run=when == [] and not s.guards,
                                runs_when=when if when else None,
                                check_step=check and command_name(s.node) != "echo"))
    return out


# Commands a check step may run: it reads the image and prints, so running it again in the image proves what it
# prints (the imports a marker reports, a test of a file). Anything else (an installer, a write) is not re-run.
_CHECK_COMMANDS = {"echo", "printf", "test", "[", "[[", "true", "false", ":", "exit"}


def _is_check(root) -> bool:
    """The RUN step only tests and prints: every command is a test, an echo/printf to the log or a
    `python -c` (imports and prints), with no redirection to a file."""
    stmts = list(statements(root))
    if not stmts:
        return False
    for s in stmts:
        if s.node.type in ("variable_assignment", "declaration_command", "test_command"):
            continue
        name = command_name(s.node)
        if name is None:
            return False
        if name in _CHECK_COMMANDS:
            if s.redirected and name in ("echo", "printf"):
                return False
            continue
        base = name.rsplit("/", 1)[-1]
        if re.fullmatch(r"python[0-9.]*", base) and any(src(a) == "-c" for a in command_args(s.node)):
            continue
        return False
    return True


def _span(node) -> tuple[int, int]:
    return node.start_byte, node.end_byte


def _final_commands(root) -> dict[tuple[int, int], list]:
    """The commands a zero exit of ``sh -c`` proves ran, each with the `if` conditions it needs ([]: none): the
    step's last top-level statement, split on `&&` (`a; b && c` exits 0 only if b and c ran; `a && b; c` says
    nothing of a or b), and inside an `if` there, the last statement of each branch, likewise (an `if` exits with
    its taken branch's last command, so that branch's final chain ran, given the branch's conditions). An `||`,
    loop, pipeline, subshell or anything else proves nothing of what it holds, but no longer of its `&&` siblings:
    `if …; fi && echo x` exits 0 only after `echo x` ran."""
    top = [n for n in root.named_children if n.type != "comment"]
    out: dict[tuple[int, int], list] = {}

    def walk(n, conds: list) -> None:
        if n.type == "list":
            kids = n.children
            if len(kids) == 3 and kids[1].type == "&&":
                walk(kids[0], conds)
                walk(kids[2], conds)
        elif n.type in ("command", "variable_assignment", "declaration_command"):
            out[_span(n)] = list(conds)
        elif n.type == "if_statement":
            for here, body in if_clauses(n):
                if body:
                    walk(body[-1], conds + here)

    if top:
        walk(top[-1], [])
    return out


_ENDS_SHELL = {"exit", "return", "exec", "eval", ".", "source"}


def _may_end_early(root) -> bool:
    """The step may end with 0 before a later command, or runs code the parser does not read: an `exit`/`return`
    without a literal non-zero status, `exec`, `eval`, a sourced file, a function (run where it is called). Then
    no zero exit proves any of its echoes ran (the real Dockerfiles only `exit 1`)."""
    for n in descendants(root):
        if n.type == "function_definition":
            return True
        name = command_name(n)
        if name in _ENDS_SHELL:
            args = [src(a) for a in command_args(n)]
            if name == "exit" and args and re.fullmatch(r"[1-9][0-9]*", args[0]):
                continue  # `exit 1`: the step fails, it never exits 0 here
            return True
    return False


def arch_dockerfiles(script: ScriptContract, texts: Mapping[str, str], commit: str) -> dict[str, DockerfileContract]:
    """Parse the Dockerfile each architecture builds, choosing it where the script leaves it open.

    The arch table may set the Dockerfile (era C); if it does not (era B), the script's DOCKERFILE
    default is the same file on every host. Building that file on another host is silent and wrong
    (an x86 wheel MANIFEST under the -arm64 tag), so for such a host the service looks for the file
    named by convention (`<default><tag suffix>`, `<default>-<arch>`) and passes it explicitly in the
    job env; when none exists and the default file does not mention the host's platform, the
    architecture is blocked with the reason. An architecture whose Dockerfile lacks a pin the script
    checks on every build is blocked too: the script would refuse it (exit 2) after submission.
    ``texts`` holds every Dockerfile at the commit (path -> text).
    """
    parsed: dict[str, DockerfileContract] = {}

    def parse(path: str) -> DockerfileContract:
        if path not in parsed:
            if path not in texts:
                raise ContractError(path, 0, f"the file at commit {commit} (the build script names it)", "no such file")
            parsed[path] = parse_dockerfile(texts[path], path)
        return parsed[path]

    for a in script.arches.values():
        if a.dockerfile_origin == "script default":
            _choose_by_convention(script, a, texts)
        if a.blocked:
            if a.dockerfile in texts:
                parse(a.dockerfile)
            continue
        df = parse(a.dockerfile)
        missing = [p for p in script.pinned_args if p not in df.pins]
        if missing:
            a.blocked = (f"{a.dockerfile} declares no `ARG {missing[0]}=<default>`, which "
                         f"{script.path}:{script.lines.get('pinned_args', 0)} checks on every build: the script "
                         f"would refuse (exit 2) to build {a.arch} from this commit")
    return parsed


def _choose_by_convention(script: ScriptContract, a: ArchSpec, texts: Mapping[str, str]) -> None:
    default = a.dockerfile
    at = f"{script.path}:{a.lines.get('dockerfile', 0)}"
    candidates = [c for c in dict.fromkeys([default + a.tag_suffix, f"{default}-{a.arch}", f"{default}.{a.arch}"])
                  if c != default]
    found = next((c for c in candidates if c in texts), None)
    if found is not None:
        if script.dockerfile_var is None:
            a.blocked = (f"{found} exists for {a.arch}, but the script builds {default} ({at}) and reads no "
                         "Dockerfile variable the job could set")
            return
        a.dockerfile = found
        a.dockerfile_origin = "naming convention"
        a.dockerfile_env = script.dockerfile_var
        a.dockerfile_why = (f"{at} defaults {script.dockerfile_var} to {default} on every host and the arch table "
                            f"sets no Dockerfile; {found} exists at the build commit ({default} + the {a.arch} "
                            f"suffix), so the job passes {script.dockerfile_var}={found} explicitly")
        a.lines["dockerfile"] = a.lines.get("dockerfile", 0)
        return
    mark = a.manifest_platform or a.kaniko_platform
    if default in texts and mark in texts[default]:
        return  # the shared default names this host's platform: it is built for it
    a.blocked = (f"{at} builds {default} on every host, and neither a {a.arch} Dockerfile "
                 f"({', '.join(candidates) or 'none by convention'}) exists nor does {default} mention {mark}: "
                 f"refusing to guess which Dockerfile an {a.uname} host should build")
