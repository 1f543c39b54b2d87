"""Parse `docker/build_gpu_rl_kaniko.sh` into a ScriptContract.

Why: the script is the authority on what a build job must carry (required variables, credentials,
architecture defaults, pins, tags). Every shape recognized here comes from the upstream eras; any
other shape raises ContractError naming the line, so a changed script stops the service instead of
producing a wrong job.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

from domain.contract.errors import ContractError
from domain.contract.models import (
    ArchSpec,
    Condition,
    ConditionalPin,
    EchoLine,
    Guard,
    Knob,
    RequiredVar,
    ScriptContract,
)
from domain.contract.shell import Command, echo_text, logical_lines, walk

SCRIPT_PATH = "docker/build_gpu_rl_kaniko.sh"

# Shell variable names the arch case table may assign, per ArchSpec field (all eras seen so far).
ARCH_FIELD_VARS: dict[str, tuple[str, ...]] = {
    "dockerfile": ("DEFAULT_DOCKERFILE", "DOCKERFILE_DEFAULT"),
    "kaniko_platform": ("KANIKO_PLATFORM",),
    "manifest_platform": ("MANIFEST_PLATFORM", "WHEEL_MANIFEST_PLATFORM"),
    "crane_asset": ("CRANE_ASSET", "CRANE_ARCH"),
    "tag_suffix": ("TAG_SUFFIX", "ARCH_TAG_SUFFIX"),
    "cache_name": ("CACHE_NAME", "CACHE_SUFFIX"),
    "default_wheel_source": ("DEFAULT_WHEEL_SOURCE",),
}
_OPTIONAL_ARCH_FIELDS = {"crane_asset"}
_VAR = r"\$\{?([A-Za-z_][A-Za-z0-9_]*)\}?"
_REQUIRED = re.compile(r'^:\s+"?\$\{([A-Za-z_][A-Za-z0-9_]*):\?')
_KNOB = re.compile(r'^([A-Za-z_][A-Za-z0-9_]*)="\$\{([A-Za-z_][A-Za-z0-9_]*):-(.*)\}"$')
_ASSIGN = re.compile(r"^([A-Za-z_][A-Za-z0-9_]*)=(.*)$")
_DEST = re.compile(r'--destination[=\s]+"?' + _VAR + ":" + r'([^"\s]+)"?')


def render(pattern: str, values: Mapping[str, str]) -> str:
    """Substitute `${NAME}`, `${NAME:-default}` and `$NAME` from ``values`` (unknown names raise KeyError)."""

    def sub(m: re.Match[str]) -> str:
        name = m.group(1) or m.group(3)
        default = m.group(2)
        if name in values and (values[name] != "" or default is None):
            return values[name]
        if default is not None:
            return default
        raise KeyError(name)

    return re.sub(r"\$\{([A-Za-z_][A-Za-z0-9_]*)(?::-([^}]*))?\}|\$([A-Za-z_][A-Za-z0-9_]*)", sub, pattern)


def pattern_vars(pattern: str) -> list[str]:
    return [a or b for a, b in re.findall(r"\$\{([A-Za-z_][A-Za-z0-9_]*)[^}]*\}|\$([A-Za-z_][A-Za-z0-9_]*)", pattern)]


def _unquote(v: str) -> str:
    v = v.strip()
    if len(v) >= 2 and v[0] == v[-1] and v[0] in "'\"":
        return v[1:-1]
    return v


def _conditions(guards: list[Guard], path: str, line: int, what: str) -> list[Condition]:
    out: list[Condition] = []
    for g in guards:
        if g.opaque is not None:
            raise ContractError(path, line, f"{what} under a plain `[ \"$VAR\" = value ]` test", g.opaque)
        if g.negated:
            if len(g.all_of) != 1:
                raise ContractError(path, line, f"{what} outside a negated compound test")
            c = g.all_of[0]
            out.append(Condition(var=c.var, op="!=" if c.op == "=" else "=", value=c.value))
        else:
            out.extend(g.all_of)
    return out


def _case_blocks(lines: list[tuple[int, str]]) -> list[tuple[int, str, list[tuple[int, str, list[str]]]]]:
    """(line, case var, arms[(line, pattern, body lines)]) for every `case "$VAR" in` ... `esac`."""
    blocks = []
    i = 0
    while i < len(lines):
        lineno, text = lines[i]
        m = re.match(r'^case\s+"?' + _VAR + r'"?\s+in$', text)
        if not m:
            i += 1
            continue
        var = m.group(1)
        arms: list[tuple[int, str, list[str]]] = []
        i += 1
        while i < len(lines) and lines[i][1] != "esac":
            ln, t = lines[i]
            am = re.match(r"^\(?([^()\s]+)\)\s*(.*)$", t)
            if am:
                body = am.group(2).strip()
                arms.append((ln, am.group(1), []))
                if body and body != ";;":
                    arms[-1][2].append(body.removesuffix(";;").strip())
            elif arms and t != ";;":
                arms[-1][2].append(t.removesuffix(";;").strip())
            i += 1
        blocks.append((lineno, var, arms))
        i += 1
    return blocks


def parse_script(text: str, path: str = SCRIPT_PATH) -> ScriptContract:
    lines = logical_lines(text)
    if not lines:
        raise ContractError(path, 0, "a bash build script", "an empty file")
    commands = list(walk(lines))

    # Required variables.
    required: list[RequiredVar] = []
    for c in commands:
        m = _REQUIRED.match(c.text)
        if m:
            when = _conditions(c.guards, path, c.line, f"required variable {m.group(1)}")
            required.append(RequiredVar(name=m.group(1), when=when, line=c.line))
    if not required:
        raise ContractError(path, 0, 'required-variable guards like `: "${GITSHA:?...}"`')
    required_names = {r.name for r in required}

    # Knobs (LOCAL="${ENV:-default}") and plain assignments.
    knobs: dict[str, Knob] = {}
    locals_: dict[str, str] = {}
    arch_var = uname_override = None
    for c in commands:
        m = _KNOB.match(c.text)
        if m:
            local, env, default = m.groups()
            if "uname -m" in default:
                arch_var, uname_override = local, env
                continue
            if env not in knobs and not c.guards:
                knobs[env] = Knob(env=env, local=local, default=default, line=c.line)
            continue
        m = _ASSIGN.match(c.text)
        if m and not c.guards and not c.in_loop:
            local, raw = m.group(1), m.group(2)
            if "uname -m" in raw:
                arch_var = local
                continue
            locals_.setdefault(local, _unquote(raw))
    if arch_var is None:
        raise ContractError(path, 0, "an architecture variable set from `uname -m`")
    local_to_env = {k.local: k.env for k in knobs.values()}

    # Case tables: architecture, wheel source, artifact URI schemes.
    blocks = _case_blocks(lines)
    arch_block = next((b for b in blocks if b[1] == arch_var), None)
    if arch_block is None:
        raise ContractError(path, 0, f'a `case "${arch_var}" in` architecture table')
    arches, field_vars = _parse_arch_table(arch_block, path)

    wheel_source_var = "WHEEL_SOURCE"
    if wheel_source_var not in knobs:
        raise ContractError(path, 0, 'an optional `WHEEL_SOURCE="${WHEEL_SOURCE:-...}"` input')
    ws_block = next((b for b in blocks if b[1] in (wheel_source_var, knobs[wheel_source_var].local)), None)
    if ws_block is None:
        raise ContractError(path, 0, 'a `case "$WHEEL_SOURCE" in` list of supported wheel sources')
    wheel_sources = _allowed_patterns(ws_block, path, "supported WHEEL_SOURCE values")
    for a in arches.values():
        if a.default_wheel_source not in wheel_sources:
            raise ContractError(path, a.line, f"a default wheel source in {wheel_sources}", a.default_wheel_source)
    schemes: list[str] = []
    for b in blocks:
        if b[1] in required_names and b[1].endswith("_URI") and not schemes:
            if any(p == "*" for _, p, _ in b[2]):  # the validating case (others dispatch on the scheme)
                schemes = [p.rstrip("*") for p in _allowed_patterns(b, path, "allowed URI schemes")]

    # Cache repository template per arch.
    cache_var = next(v for v, f in field_vars.items() if f == "cache_name")
    cache_knob = next((k for k in knobs.values() if f"${cache_var}" in k.default
                       or f"${{{cache_var}}}" in k.default), None)
    if cache_knob is None:
        raise ContractError(path, 0, f"a cache repository input whose default uses ${cache_var}")

    # Destinations: repository, tag, wheels tag, floating tag.
    repo_local = tag_local = wheels_local = floating_local = None
    floating_var = preserve_var = None
    for c in commands:
        for m in _DEST.finditer(c.text):
            repo, tag = m.group(1), m.group(2).lstrip("$").strip("{}")
            if repo_local not in (None, repo):
                raise ContractError(path, c.line, f"every --destination in ${repo_local}", repo)
            repo_local = repo
            conds = _conditions(c.guards, path, c.line, "a --destination")
            if "--target" in c.text:
                wheels_local = tag
                preserve_var = next((x.var for x in conds if x.var != wheel_source_var), None)
            elif conds:
                floating_local = tag
                floating_var = next((x.var for x in conds if x.value == "1"), conds[0].var)
            else:
                tag_local = tag
    if repo_local is None or tag_local is None:
        raise ContractError(path, 0, 'a builder `--destination "$REPO:$TAG"`')
    repo_knob = next((k for k in knobs.values() if k.local == repo_local), None)
    if repo_knob is None:
        raise ContractError(path, 0, f'an image repository input `{repo_local}="${{VAR:-<repo>}}"`')
    known = set(required_names) | set(local_to_env) | set(field_vars) | {arch_var} | set(locals_)

    def tag_pattern(local: str | None, what: str) -> str | None:
        if local is None:
            return None
        if local not in locals_:
            raise ContractError(path, 0, f"an assignment of ${local} ({what})")
        pat = locals_[local]
        for v in pattern_vars(pat):
            if v not in known:
                raise ContractError(path, 0, f"{what} built from known variables", v)
        return pat

    for a in arches.values():
        a.cache_repo = (
            cache_knob.default.replace(f"${{{repo_local}}}", "{repository}")
            .replace(f"${repo_local}", "{repository}")
            .replace(f"${{{cache_var}}}", a.cache_name)
            .replace(f"${cache_var}", a.cache_name)
        )

    pinned, conditional_pins, pin_echo = _parse_pins(commands, path)
    user_var, token_var = _credentials(text, commands, required, path)

    task_guard = None
    m = re.search(r'\[\s+-z\s+"\$\{([A-Za-z_][A-Za-z0-9_]*)(?::-)?\}"\s+\]', text)
    if m and "disposable" in text:
        task_guard = m.group(1)

    echoes = [
        EchoLine(template=t, guards=c.guards, line=c.line)
        for c in commands
        if not c.in_loop and (t := echo_text(c.text)) is not None
    ]
    dockerfile_knob = next((k for k in knobs.values() if any(
        f"${v}" in k.default or f"${{{v}}}" in k.default for v, f in field_vars.items() if f == "dockerfile")), None)
    return ScriptContract(
        path=path,
        required=required,
        credential_user_var=user_var,
        credential_token_var=token_var,
        arch_var=arch_var,
        uname_override_var=uname_override,
        task_guard_var=task_guard,
        arches=arches,
        arch_field_vars=field_vars,
        pinned_args=pinned,
        conditional_pinned_args=conditional_pins,
        wheel_source_var=wheel_source_var,
        wheel_sources=wheel_sources,
        artifact_uri_schemes=schemes,
        knobs=knobs,
        image_repository_var=repo_knob.env,
        image_repository_default=repo_knob.default,
        repository_local=repo_local,
        tag_prefix_var=next((k.env for k in knobs.values() if k.env.endswith("TAG_PREFIX")), None),
        megatron_var=next((k.env for k in knobs.values() if "MEGATRON" in k.env), None),
        floating_var=floating_var,
        preserve_wheels_var=preserve_var,
        dockerfile_var=dockerfile_knob.env if dockerfile_knob else None,
        tag_pattern=tag_pattern(tag_local, "the image tag"),
        wheels_tag_pattern=tag_pattern(wheels_local, "the wheels tag"),
        floating_tag_pattern=tag_pattern(floating_local, "the floating tag"),
        locals=locals_,
        echoes=echoes,
        pin_echo=pin_echo,
    )


def _allowed_patterns(block, path: str, what: str) -> list[str]:
    lineno, var, arms = block
    allowed: list[str] = []
    has_reject = False
    for _ln, pattern, body in arms:
        exits = any(re.search(r"\bexit\s+[1-9]", b) for b in body)
        if pattern == "*":
            has_reject = exits
            continue
        if exits:
            continue
        allowed.extend(pattern.split("|"))
    if not allowed or not has_reject:
        raise ContractError(path, lineno, f"{what}: allowed arms plus a `*)` arm that exits non-zero")
    return allowed


def _parse_arch_table(block, path: str) -> tuple[dict[str, ArchSpec], dict[str, str]]:
    lineno, var, arms = block
    alias = {v: f for f, names in ARCH_FIELD_VARS.items() for v in names}
    arches: dict[str, ArchSpec] = {}
    field_vars: dict[str, str] = {}
    rejects = False
    for ln, pattern, body in arms:
        if pattern == "*":
            rejects = any(re.search(r"\bexit\s+2\b", b) for b in body)
            continue
        if "|" in pattern or not re.fullmatch(r"[A-Za-z0-9_]+", pattern):
            raise ContractError(path, ln, "one `uname -m` value per architecture arm", pattern)
        values: dict[str, str] = {}
        for b in body:
            m = _ASSIGN.match(b)
            if not m:
                raise ContractError(path, ln, "only VAR=value assignments in an architecture arm", b)
            name = m.group(1)
            if name not in alias:
                raise ContractError(path, ln, f"a known architecture setting ({', '.join(sorted(alias))})", name)
            values[alias[name]] = _unquote(m.group(2))
            field_vars[name] = alias[name]
        missing = [f for f in ARCH_FIELD_VARS if f not in values and f not in _OPTIONAL_ARCH_FIELDS]
        if missing:
            raise ContractError(path, ln, f"arm {pattern}) to set {', '.join(missing)}")
        pm = re.fullmatch(r"linux/([a-z0-9_]+)", values["kaniko_platform"])
        if not pm:
            raise ContractError(path, ln, "a kaniko platform like linux/amd64", values["kaniko_platform"])
        arch = pm.group(1)
        arches[arch] = ArchSpec(arch=arch, uname=pattern, cache_repo="", line=ln, **values)
    if not arches:
        raise ContractError(path, lineno, "at least one architecture arm")
    if not rejects:
        raise ContractError(path, lineno, "a `*)` arm that exits 2 for an unsupported host")
    return arches, field_vars


def _parse_pins(commands: list[Command], path: str) -> tuple[list[str], list[ConditionalPin], str]:
    echo = next((c for c in commands if c.in_loop and (t := echo_text(c.text)) and t.startswith("[pin]")), None)
    if echo is None or not echo.loop_header:
        raise ContractError(path, 0, "a pin guard loop that echoes `[pin] NAME=value (from <Dockerfile>)`")
    m = re.match(r"^for\s+\w+\s+in\s+(.*)$", echo.loop_header)
    if not m:
        raise ContractError(path, echo.line, "`for pin in ...` around the [pin] echo", echo.loop_header)
    items = m.group(1).strip()
    vm = re.fullmatch(r'"?' + _VAR + r'"?', items)
    pinned: list[str] = []
    conditional: list[ConditionalPin] = []
    if not vm:
        pinned = items.split()
    else:
        list_var = vm.group(1)
        for c in commands:
            am = _ASSIGN.match(c.text)
            if not am or am.group(1) != list_var:
                continue
            names = [w for w in _unquote(am.group(2)).split() if not w.startswith("$")]
            if c.guards:
                when = _conditions(c.guards, path, c.line, f"an addition to {list_var}")
                conditional.extend(ConditionalPin(name=n, when=when) for n in names)
            else:
                pinned.extend(names)
        if not pinned:
            raise ContractError(path, echo.line, f"an assignment of the pin list ${list_var}")
    for n in pinned + [p.name for p in conditional]:
        if not re.fullmatch(r"[A-Z][A-Z0-9_]*", n):
            raise ContractError(path, echo.line, "pinned ARG names", n)
    return pinned, conditional, echo_text(echo.text) or ""


def _credentials(text: str, commands: list[Command], required: list[RequiredVar], path: str):
    names = [r.name for r in required if r.always]
    m = re.search(r"""printf\s+['"]%s:%s['"]\s+"\$\{?(\w+)\}?"\s+"\$\{?(\w+)\}?\"""", text)
    if m:
        user, token = m.group(1), m.group(2)
    else:
        token = next((n for n in names if re.search(r"(TOKEN|PASSWORD)$", n)), None)
        user = next((n for n in names if "USER" in n), None)
    if token is None:
        raise ContractError(path, 0, "a registry token variable (a required *_TOKEN or `printf '%s:%s' user token`)")
    if token not in {r.name for r in required}:
        raise ContractError(path, 0, f'`: "${{{token}:?...}}"` (the registry token is used but not required)')
    set_x = next((c.line for c in commands if re.fullmatch(r"set\s+-[a-z]*x[a-z]*", c.text)), None)
    if set_x is not None:
        unset = next((c.line for c in commands if re.match(r"^unset\b.*\b" + token + r"\b", c.text)), None)
        if unset is None or unset > set_x:
            raise ContractError(path, set_x, f"`unset {token}` before `set -x` (the token would reach the log)")
    return user, token
