"""Read `docker/build_gpu_rl_kaniko.sh` into a ScriptContract, from its bash syntax tree.

Why a syntax tree (tree-sitter-bash, see shell.py) and not line patterns: the script is the authority
on what a build job must carry, and upstream rewrites it freely (renamed variables, `case` tables that
grow a column, `if` conditions joined with `&&`/`||`, arrays with conditional `+=`). Every field here
is found by what it means in the script rather than by its spelling:

- required variables: every `${VAR:?}` expansion, with the if/&&/case branch it sits in as a decidable
  condition (`WHEEL_SOURCE=auto`, `WHEEL_SOURCE=wheel-builder and HF_WHEEL_REPOSITORY non-empty`);
- the architecture table: the `case` on the variable set from `uname -m`, read whole; its columns are
  interpreted by their values and their use (the `linux/<arch>` value is the platform, the table
  variable the image tag expands is the tag suffix, the one the wheel-source and Dockerfile defaults
  expand are those defaults);
- repository, tags and cache: from the `--destination` / `--cache-repo` words the executor receives;
- pinned ARGs: the list the loop that reads `ARG` lines out of the Dockerfile iterates, with its
  conditional appends.

Constructs none of this needs are ignored. A needed field that cannot be determined raises
ParserNeedsAttention (file, line, field, and that this parser, not the upstream file, needs work).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass

from tree_sitter import Node

from domain.contract.errors import ContractError, ParserNeedsAttention
from domain.contract.models import (
    ArchSpec,
    ConditionalPin,
    EchoLine,
    Knob,
    RequiredVar,
    ScriptContract,
)
from domain.contract.shell import (
    Stmt,
    command_args,
    command_name,
    descendants,
    expansion_parts,
    functions,
    line,
    parse_bash,
    printed_lines,
    src,
    statements,
    template_vars,
    word_text,
)

SCRIPT_PATH = "docker/build_gpu_rl_kaniko.sh"
PARSER = "domain/contract/script.py"
_UNAME = {"amd64": "x86_64", "arm64": "aarch64"}
_ARCH_OF = {"x86_64": "amd64", "X86_64": "amd64", "aarch64": "arm64", "AARCH64": "arm64", "arm64": "arm64",
            "ARM64": "arm64"}


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
    return template_vars(pattern)


def shell_values(script: ScriptContract, arch: str, env: Mapping[str, str], commit: str) -> dict[str, str]:
    """What the script's variables hold on ``arch``'s host with job ``env``: arch table, knobs, tags."""
    a = script.arches[arch]
    values: dict[str, str] = {script.arch_var: a.uname, "GITSHA": commit}
    values.update(a.settings)
    for var, f in script.arch_field_vars.items():
        values.setdefault(var, str(getattr(a, f) or ""))
    for _ in range(2):  # knob defaults may expand other knobs
        for k in script.knobs.values():
            raw = env[k.env] if k.env in env else k.default
            try:
                values[k.local] = render(raw, values)
            except KeyError:
                continue
    for name, pat in script.locals.items():
        if name not in values and pat in (script.tag_pattern, script.wheels_tag_pattern, script.floating_tag_pattern):
            try:
                values[name] = render(pat, values)
            except KeyError:
                pass
    return values


# ----------------------------------------------------------------------------- reading helpers


@dataclass
class _Assign:
    name: str
    append: bool
    value: Node | None
    stmt: Stmt

    @property
    def text(self) -> str:
        return word_text(self.value) if self.value is not None else ""

    @property
    def top(self) -> bool:
        return not self.stmt.guards and not self.stmt.in_loop and not self.stmt.case_arms


def _assignments(stmt: Stmt) -> list[_Assign]:
    n = stmt.node
    nodes = [n] if n.type == "variable_assignment" else [
        c for c in n.children if c.type == "variable_assignment"] if n.type in (
        "variable_assignments", "declaration_command") else []
    out = []
    for a in nodes:
        name = a.child_by_field_name("name")
        if name is None or name.type != "variable_name":
            continue
        append = any(c.type == "+=" for c in a.children)
        out.append(_Assign(src(name), append, a.child_by_field_name("value"), stmt))
    return out


def _single_expansion(value: Node | None) -> Node | None:
    """The `${...}` a value consists of (`"${X:-d}"` or `${X:-d}`), else None."""
    if value is None:
        return None
    n = value
    if n.type == "string":
        parts = [c for c in n.children if c.type != '"']
        if len(parts) != 1:
            return None
        n = parts[0]
    return n if n.type == "expansion" else None


def _has_uname(node: Node) -> bool:
    for n in descendants(node):
        if n.type == "command" and command_name(n) == "uname" and any(src(a) == "-m" for a in command_args(n)):
            return True
    return False


def _arg_after(cmd: Node, flag: str) -> list[tuple[Node, str]]:
    """Values of ``flag`` in a command or array: `--flag value` and `--flag=value` (word node, text)."""
    words = command_args(cmd) if cmd.type == "command" else [c for c in cmd.named_children]
    out = []
    for i, w in enumerate(words):
        t = word_text(w)
        if t == flag and i + 1 < len(words):
            out.append((words[i + 1], word_text(words[i + 1])))
        elif t.startswith(flag + "="):
            out.append((w, t[len(flag) + 1:]))
    return out


def _var_ref(text: str) -> str | None:
    m = re.fullmatch(r"\$\{?([A-Za-z_][A-Za-z0-9_]*)\}?", text)
    return m.group(1) if m else None


@dataclass
class _Dest:
    repo: str
    tag: str
    stmt: Stmt
    target: bool  # a `--target` stage build (the wheels image)
    line: int
    # Set for an array destination that another statement empties (`FLOATING=(--destination …)` then
    # `[ … ] || FLOATING=()`): pushed only when that statement does not run, so it is conditional too.
    emptied_by: Stmt | None = None

    @property
    def conditional(self) -> bool:
        return bool(self.stmt.guards) or self.emptied_by is not None

    @property
    def guards(self) -> list:
        return self.stmt.guards or (self.emptied_by.guards if self.emptied_by is not None else [])


class _Reader:
    def __init__(self, text: str, path: str):
        self.path = path
        self.text = text
        self.root = parse_bash(text, path)
        self.nodes = list(descendants(self.root))  # walked by several readers: materialize once
        self.stmts = list(statements(self.root))
        self.funcs = functions(self.root)
        self.assigns = [a for s in self.stmts for a in _assignments(s)]
        self.assigned = {a.name for a in self.assigns}

    def code_text(self) -> str:
        """The script without its comments (prose about other hosts is not evidence)."""
        data = bytearray(self.text.encode())
        for n in self.nodes:
            if n.type == "comment":
                data[n.start_byte:n.end_byte] = b" " * (n.end_byte - n.start_byte)
        return data.decode(errors="replace")

    def need(self, line_no: int, field: str, detail: str) -> ParserNeedsAttention:
        return ParserNeedsAttention(self.path, line_no, field, detail, PARSER)

    # ------------------------------------------------------------------ required variables
    def required(self) -> list[RequiredVar]:
        out: list[RequiredVar] = []
        for s in self.stmts:
            for n in descendants(s.node):
                if n.type != "expansion":
                    continue
                var, op, _ = expansion_parts(n)
                if var is None or op not in (":?", "?"):
                    continue
                for g in s.guards:
                    if g.opaque is not None:
                        raise self.need(s.line, f"condition under which {var} is required",
                                        f"`{g.opaque}` is not a test on variables the parser can decide")
                out.append(RequiredVar(name=var, when=list(s.guards), line=s.line))
        if not out:
            raise self.need(0, "required variables", 'no `: "${VAR:?}"` requirement anywhere in the script')
        return out

    # ------------------------------------------------------------------ knobs and locals
    def arch_var(self) -> tuple[str | None, str | None, int]:
        for a in self.assigns:
            if a.value is not None and _has_uname(a.value):
                exp = _single_expansion(a.value)
                override = expansion_parts(exp)[0] if exp is not None else None
                return a.name, override, a.stmt.line
        return None, None, 0

    def knobs(self, skip: set[str]) -> dict[str, Knob]:
        knobs: dict[str, Knob] = {}
        locals_done: set[str] = set()
        for a in self.assigns:
            if a.stmt.in_loop or a.name in skip:
                continue
            exp = _single_expansion(a.value)
            if exp is None:
                continue
            var, op, operand = expansion_parts(exp)
            if var is None or op not in (":-", "-", ":=", "=") or src(exp).startswith(("${!", "${#")):
                continue
            if var in knobs or a.name in locals_done:
                continue
            locals_done.add(a.name)
            knobs[var] = Knob(env=var, local=a.name, default=operand or "", line=a.stmt.line)
        # Inline defaults on inputs the script never assigns: `[ "${PUSH_FLOATING:-0}" = "1" ]`.
        for s in self.stmts:
            for n in descendants(s.node):
                if n.type != "expansion" or src(n).startswith(("${!", "${#")):
                    continue
                var, op, operand = expansion_parts(n)
                if var and op in (":-", "-") and var not in knobs and var not in self.assigned and var not in skip:
                    knobs[var] = Knob(env=var, local=var, default=operand or "", line=s.line)
        for node in self.nodes:
            if node.type in ("if_statement", "elif_clause", "while_statement"):
                for i, c in enumerate(node.children):
                    if node.field_name_for_child(i) != "condition":
                        continue
                    for n in descendants(c):
                        if n.type == "expansion" and not src(n).startswith(("${!", "${#")):
                            var, op, operand = expansion_parts(n)
                            if var and op in (":-", "-") and var not in knobs and var not in self.assigned:
                                knobs[var] = Knob(env=var, local=var, default=operand or "", line=line(n))
        return knobs

    def locals(self, skip: set[str]) -> dict[str, tuple[str, int]]:
        out: dict[str, tuple[str, int]] = {}
        for a in self.assigns:
            if a.top and not a.append and a.name not in skip and a.value is not None and a.value.type != "array":
                out.setdefault(a.name, (a.text, a.stmt.line))
        return out

    # ------------------------------------------------------------------ architecture table
    def arch_table(self, arch_var: str | None) -> tuple[Node, list[tuple[str, list[str], int, dict[str, tuple[str, int]]]]] | None:
        for node in self.nodes:
            if node.type != "case_statement" or self._in_function(node):
                continue
            value = node.child_by_field_name("value")
            if value is None:
                continue
            if not (_has_uname(value) or (arch_var and arch_var in [
                    src(v) for v in descendants(value) if v.type == "variable_name"])):
                continue
            arms = []
            for item in (c for c in node.named_children if c.type == "case_item"):
                pats = [src(c) for i, c in enumerate(item.children) if item.field_name_for_child(i) == "value"]
                if pats == ["*"] or not pats:
                    continue
                settings: dict[str, tuple[str, int]] = {}
                for c in item.named_children:
                    nodes = [c] if c.type == "variable_assignment" else [
                        x for x in c.named_children if x.type == "variable_assignment"] if c.type == "variable_assignments" else []
                    for a in nodes:
                        name = a.child_by_field_name("name")
                        val = a.child_by_field_name("value")
                        if name is not None:
                            settings[src(name)] = (word_text(val) if val is not None else "", line(a))
                arms.append((pats[0], pats, line(item), settings))
            return node, arms
        return None

    def _in_function(self, node: Node) -> bool:
        p = node.parent
        while p is not None:
            if p.type == "function_definition":
                return True
            p = p.parent
        return False

    # ------------------------------------------------------------------ destinations
    def destinations(self) -> list[_Dest]:
        out: list[_Dest] = []
        for s in self.stmts:
            n = s.node
            holders: list[tuple[Node, bool, str | None]] = []
            if n.type == "command":
                holders.append((n, any(word_text(a) == "--target" or word_text(a).startswith("--target=")
                                       for a in command_args(n)), None))
            for a in _assignments(s):
                if a.value is not None and a.value.type == "array":
                    holders.append((a.value, False, a.name))
            for holder, target, array in holders:
                emptied = next((e.stmt for e in self.assigns if array and e.name == array and e.stmt is not s
                                and not e.append and e.value is not None and e.value.type == "array"
                                and not e.value.named_children), None)
                for w, text in _arg_after(holder, "--destination"):
                    where = line(w)
                    ref = _var_ref(text)
                    if ref is not None:  # `--destination "$IMAGE"` with IMAGE="${REPO}:${TAG}" assigned earlier
                        image = next((a for a in self.assigns if a.name == ref and not a.append), None)
                        if image is not None:
                            text, where = image.text, image.stmt.line
                    m = re.fullmatch(r"(\$\{[A-Za-z_][A-Za-z0-9_]*\}|\$[A-Za-z_][A-Za-z0-9_]*):(.+)", text)
                    if not m:
                        raise self.need(s.line, "image repository", f"`--destination {text}` is not `$REPO:TAG`")
                    out.append(_Dest(repo=_var_ref(m.group(1)) or "", tag=m.group(2), stmt=s, target=target,
                                     line=where, emptied_by=emptied))
        return out

    # ------------------------------------------------------------------ pins
    def pin_loop(self) -> tuple[Node, str] | None:
        for node in self.nodes:
            if node.type != "for_statement" or self._in_function(node):
                continue
            body = node.child_by_field_name("body")
            if body is None:
                continue
            texts = [src(body)]
            for n in descendants(body):
                name = command_name(n) if n.type == "command" else None
                if name in self.funcs:
                    texts.append(src(self.funcs[name]))
            if any(re.search(r"\bARG\b", t) for t in texts):
                var = node.child_by_field_name("variable")
                return node, (src(var) if var is not None else "")
        return None


def parse_script(text: str, path: str = SCRIPT_PATH) -> ScriptContract:
    if not text.strip():
        raise ContractError(path, 0, "a bash build script", "an empty file")
    r = _Reader(text, path)
    lines: dict[str, int] = {}
    required = r.required()

    arch_var, uname_override, arch_line = r.arch_var()
    knobs = r.knobs(skip={v for v in (arch_var, uname_override) if v})
    knob_by_local = {k.local: k for k in knobs.values()}

    # Wheel source variable and the values the script accepts for it.
    ws_knob = next((k for k in knobs.values() if k.env.endswith("WHEEL_SOURCE")), None)
    if ws_knob is None:
        raise r.need(0, "wheel source variable", 'no `WHEEL_SOURCE="${WHEEL_SOURCE:-...}"` input')
    lines["wheel_source"] = ws_knob.line
    ws_names = {ws_knob.env, ws_knob.local}
    wheel_sources: list[str] = []

    def add_source(v: str) -> None:
        if v and v != "*" and "$" not in v and v not in wheel_sources:
            wheel_sources.append(v)

    for node in r.nodes:
        if node.type == "binary_expression":
            left, right, op = (node.child_by_field_name(x) for x in ("left", "right", "operator"))
            if left is not None and right is not None and op is not None and src(op) in ("=", "==", "!="):
                if {v for v in (src(x) for x in descendants(left) if x.type == "variable_name")} & ws_names:
                    add_source(word_text(right))
        elif node.type == "case_statement":
            value = node.child_by_field_name("value")
            if value is not None and {src(x) for x in descendants(value) if x.type == "variable_name"} & ws_names:
                for item in (c for c in node.named_children if c.type == "case_item"):
                    body = " ".join(src(c) for c in item.named_children)
                    if re.search(r"\bexit\s+[1-9]", body):
                        continue
                    for i, c in enumerate(item.children):
                        if item.field_name_for_child(i) == "value":
                            for v in src(c).split("|"):
                                add_source(v)
    for a in r.assigns:
        if a.name in ws_names and a.value is not None and "$" not in a.text:
            add_source(a.text)

    # Destinations: repository, main tag, wheels tag, floating tag.
    dests = r.destinations()
    main = [d for d in dests if not d.target and not d.conditional]
    if not main:
        raise r.need(0, "image tag", "no unconditional `--destination \"$REPO:TAG\"` for the image")
    repo_local = main[0].repo
    for d in dests:
        if d.repo != repo_local:
            raise r.need(d.stmt.line, "image repository", f"destinations push to both ${repo_local} and ${d.repo}")
    repo_knob = knob_by_local.get(repo_local)
    if repo_knob is None or "$" in repo_knob.default:
        raise r.need(main[0].stmt.line, "image repository",
                     f'${repo_local} is not an input with a literal default like `{repo_local}="${{VAR:-<repo>}}"`')
    lines["image_repository_default"] = repo_knob.line
    locals_ = r.locals(skip=set(knob_by_local) | ({arch_var} if arch_var else set()))

    def tag_pattern(d: _Dest | None, what: str) -> str | None:
        if d is None:
            return None
        pat, ln = d.tag, d.line
        ref = _var_ref(pat)
        if ref is not None and ref in locals_:
            pat, ln = locals_[ref]
        lines[what] = ln
        return pat

    tag = tag_pattern(main[0], "tag_pattern")
    assert tag is not None
    wheels = next((d for d in dests if d.target), None)
    floating = next((d for d in dests if not d.target and d.conditional), None)
    wheels_tag = tag_pattern(wheels, "wheels_tag_pattern")
    floating_tag = tag_pattern(floating, "floating_tag_pattern")
    floating_var = preserve_var = None
    if floating is not None:
        conds = [c for g in floating.guards for clause in g.dnf() for c in clause]
        floating_var = next((c.var for c in conds if c.value == "1"), conds[0].var if conds else None)
    if wheels is not None:
        conds = [c for g in wheels.stmt.guards for clause in g.dnf() for c in clause]
        preserve_var = next((c.var for c in conds if c.var not in ws_names), None)

    # Architecture table.
    table = r.arch_table(arch_var)
    dockerfile_knob = None
    dockerfile_word_vars: list[str] = []  # variables of the executor's `--dockerfile` word
    for s in r.stmts:
        if s.node.type == "command":
            for _w, text in _arg_after(s.node, "--dockerfile"):
                dockerfile_word_vars = dockerfile_word_vars or template_vars(text)
                refs = [v for v in template_vars(text) if v in knob_by_local]
                if refs:
                    dockerfile_knob = knob_by_local[refs[-1]]
                    break
        if dockerfile_knob:
            break
    if dockerfile_knob is not None:
        lines["dockerfile"] = dockerfile_knob.line
    arches, field_vars = _interpret_arches(r, table, arch_var, tag, ws_knob, dockerfile_knob, lines,
                                           dockerfile_word_vars)
    if table is not None:
        lines["arch_table"] = line(table[0])

    tag_known = set(knob_by_local) | {x.name for x in required} | set(field_vars) | set(locals_) | {
        v for a in arches.values() for v in a.settings} | ({arch_var} if arch_var else set())
    for what, key, pat in (("image tag", "tag_pattern", tag), ("wheels tag", "wheels_tag_pattern", wheels_tag),
                           ("floating tag", "floating_tag_pattern", floating_tag)):
        for v in template_vars(pat or ""):
            if v not in tag_known:
                raise r.need(lines.get(key, 0), what,
                             f"{pat} expands ${v}, which the script does not set before it")

    # Cache repository per architecture.
    cache_tpl = None
    for s in r.stmts:
        holders = [s.node] if s.node.type == "command" else [a.value for a in _assignments(s)
                                                             if a.value is not None and a.value.type == "array"]
        for h in holders:
            for _w, text in _arg_after(h, "--cache-repo"):
                ref = _var_ref(text)
                if ref and ref in knob_by_local:
                    cache_tpl = knob_by_local[ref].default
                    lines["cache_repo"] = knob_by_local[ref].line
                elif ref and ref in locals_:
                    cache_tpl, lines["cache_repo"] = locals_[ref]
                else:
                    cache_tpl, lines["cache_repo"] = text, s.line
        if cache_tpl:
            break
    for a in arches.values():
        if cache_tpl is None:
            continue
        try:
            a.cache_repo = render(cache_tpl, {**a.settings, repo_local: "{repository}",
                                              repo_knob.env: "{repository}"})
        except KeyError:
            continue
        if a.cache_repo.startswith("{repository}/"):
            a.cache_name = a.cache_repo.removeprefix("{repository}/")

    for a in arches.values():
        if a.default_wheel_source not in wheel_sources:
            add_source(a.default_wheel_source)

    # Artifact URI schemes the script accepts.
    schemes: list[str] = []
    uri_vars = {x.name for x in required if x.name.endswith("_URI")}
    for node in r.nodes:
        vals: list[str] = []
        if node.type == "binary_expression":
            left, right = node.child_by_field_name("left"), node.child_by_field_name("right")
            if left is not None and right is not None and {
                    src(x) for x in descendants(left) if x.type == "variable_name"} & uri_vars:
                vals = [src(right)]
        elif node.type == "case_statement":
            value = node.child_by_field_name("value")
            if value is not None and {src(x) for x in descendants(value) if x.type == "variable_name"} & uri_vars:
                vals = [v for item in node.named_children if item.type == "case_item"
                        for i, c in enumerate(item.children) if item.field_name_for_child(i) == "value"
                        for v in src(c).split("|")]
        for v in vals:
            m = re.fullmatch(r"([a-z][a-z0-9+.-]*://)\*", v)
            if m and m.group(1) not in schemes:
                schemes.append(m.group(1))

    pinned, conditional, pin_echo, loop_var, value_var = _pins(r, lines)
    user_var, token_var = _credentials(r, required, lines)

    def env_of(local: str | None) -> str | None:
        """The input a shell variable reads (`PUSH_FLOATING` for `${PUSH_FLOATING:-0}`)."""
        return knob_by_local[local].env if local in knob_by_local else local

    echoes: list[EchoLine] = []
    for s in r.stmts:
        if s.in_loop:
            continue
        for p in printed_lines(s):
            echoes.append(EchoLine(template=p.template, guards=s.guards, line=s.line, source_text=p.source_text))

    code = r.code_text()
    self_ref = re.search(r'BASH_SOURCE|dirname\s+(?:--\s+)?"?\$\{?0\b|\$\{0%/?\*?\}|(?:realpath|readlink\s+-f)\s+"?\$\{?0\b',
                         code)
    if self_ref:
        lines["self_location"] = code.count("\n", 0, self_ref.start()) + 1
    # errexit as bash reads it (`set -e`, `-euo pipefail`, `-o errexit`; `set +e`, `+o errexit` ends it): while
    # it is on, reaching the final kaniko push proves the echoes it covered ran (domain/log_evidence.py).
    spans = _errexit_spans(r)
    if spans:
        lines["errexit"] = spans[0][0]
        if spans[0][1] is not None:
            lines["errexit_off"] = spans[0][1]

    return ScriptContract(
        build_args=_build_args(r.code_text()),
        path=path,
        required=required,
        credential_user_var=user_var,
        credential_token_var=token_var,
        arch_var=arch_var or "",
        uname_override_var=uname_override,
        task_guard_var=_task_guard(r),
        arches=arches,
        arch_field_vars=field_vars,
        pinned_args=pinned,
        conditional_pinned_args=conditional,
        wheel_source_var=ws_knob.env,
        wheel_sources=wheel_sources,
        artifact_uri_schemes=schemes,
        knobs=knobs,
        image_repository_var=repo_knob.env,
        image_repository_default=repo_knob.default,
        repository_local=repo_local,
        tag_prefix_var=next((knob_by_local[v].env for v in template_vars(tag)
                             if v in knob_by_local and knob_by_local[v].env.endswith("TAG_PREFIX")), None),
        megatron_var=next((k.env for k in knobs.values() if "MEGATRON" in k.env), None),
        floating_var=env_of(floating_var),
        preserve_wheels_var=env_of(preserve_var),
        dockerfile_var=dockerfile_knob.env if dockerfile_knob else None,
        tag_pattern=tag,
        wheels_tag_pattern=wheels_tag,
        floating_tag_pattern=floating_tag,
        locals={k: v for k, (v, _) in locals_.items()},
        echoes=echoes,
        pin_echo=pin_echo,
        pin_loop_var=loop_var,
        pin_value_var=value_var,
        lines=lines | {"arch_var": arch_line},
        errexit_spans=spans,
    )


_BUILD_ARG = re.compile(r"""--build-arg(?:\s+|=)["']?([A-Za-z_][A-Za-z0-9_]*)=(\S*)""")


def _build_args(text: str) -> dict[str, str] | None:
    """What the script passes as `--build-arg NAME=VALUE` (name -> the value as written, quotes removed); None if
    one `--build-arg` does not spell its name (`--build-arg "$x"`): then any ARG may be overridden by a value we
    do not know. A name passed with two different values (two kaniko calls, or one flag overriding another) is
    recorded as `<varies>`: a log line of one call must not prove the other's value."""
    found = [(m.group(1), m.group(2).replace('"', "").replace("'", "")) for m in _BUILD_ARG.finditer(text)]
    if len(found) != text.count("--build-arg"):
        return None
    out: dict[str, str] = {}
    for name, value in found:
        out[name] = value if out.get(name, value) == value else "<varies>"
    return out


def _set_errexit(node: Node) -> bool | None:
    """What one `set` command does to errexit: True (`-e`, `-o errexit`), False (`+e`, `+o errexit`), None."""
    words = [src(a) for a in command_args(node)]
    effect: bool | None = None
    i = 0
    while i < len(words):
        w = words[i]
        i += 1
        if w in ("-", "--") or w[:1] not in ("-", "+") or len(w) < 2:
            break
        for c in w[1:]:
            if c == "o":
                name = words[i] if i < len(words) else ""
                i += 1
                if name == "errexit":
                    effect = w[0] == "-"
            elif c == "e":
                effect = w[0] == "-"
    return effect


def _errexit_spans(r: _Reader) -> list[tuple[int, int | None]]:
    """Script line ranges [on, off) where errexit is on, read from the syntax tree like bash would run it.

    Only an unguarded `set -e` outside functions, subshells and loops turns it on (elsewhere it may not
    run, or not in this shell); any `set +e` turns it off from its line, or, inside a function, from the
    function's definition (the function may run at any later point)."""
    plain = {(s.node.start_byte, s.node.end_byte) for s in r.stmts
             if not s.guards and not s.in_loop and not s.case_arms}
    events: list[tuple[int, bool]] = []
    for n in r.nodes:
        if n.type != "command" or command_name(n) != "set":
            continue
        effect = _set_errexit(n)
        if effect is None:
            continue
        ancestors = []
        p = n.parent
        while p is not None:
            ancestors.append(p)
            p = p.parent
        func = next((a for a in reversed(ancestors) if a.type == "function_definition"), None)
        nested = any(a.type in ("subshell", "command_substitution", "process_substitution") for a in ancestors)
        if effect:
            if func is None and not nested and (n.start_byte, n.end_byte) in plain:
                events.append((line(n), True))
        elif not nested or func is not None:
            events.append((line(func) if func is not None else line(n), False))
    spans: list[tuple[int, int | None]] = []
    start: int | None = None
    for at, on in sorted(events, key=lambda e: (e[0], e[1])):
        if on and start is None:
            start = at
        elif not on and start is not None:
            spans.append((start, at))
            start = None
    if start is not None:
        spans.append((start, None))
    return spans


def errexit_covers(spans: list[tuple[int, int | None]], at: int) -> bool:
    """errexit is on at script line ``at``."""
    return any(on < at and (off is None or at < off) for on, off in spans)


def _interpret_arches(r: _Reader, table, arch_var, tag: str, ws_knob: Knob, dockerfile_knob: Knob | None,
                      lines: dict[str, int], dockerfile_word_vars: list[str] = ()
                      ) -> tuple[dict[str, ArchSpec], dict[str, str]]:
    """Each arm of the `uname -m` table, read by meaning (see the module docstring)."""
    tag_vars = template_vars(tag)
    ws_vars = template_vars(ws_knob.default)
    # the table may set the knob's default (DEFAULT_DOCKERFILE) or the executor's variable itself
    df_vars = (template_vars(dockerfile_knob.default) if dockerfile_knob else []) + list(dockerfile_word_vars)
    field_vars: dict[str, str] = {}
    arches: dict[str, ArchSpec] = {}

    if table is None:
        # No table: one implicit architecture, if the script names exactly one platform.
        # Evidence, in the script's own words: a kaniko/crane platform, a wheel MANIFEST platform or a
        # crane release asset; all must name the same architecture.
        code = r.code_text()
        named = set(re.findall(r"\blinux/(amd64|arm64)\b", code))
        named |= {_ARCH_OF[m] for m in re.findall(r"(?i)\blinux_(x86_64|aarch64|arm64)\b", code)}
        if len(named) != 1 or dockerfile_knob is None or ws_vars:
            raise r.need(0, "build architecture", "no `case` table on `uname -m`, and the script does not name "
                         "exactly one platform (linux/<arch>, linux_<machine>, Linux_<machine>) with literal "
                         "Dockerfile and wheel-source defaults")
        arch = named.pop()
        if template_vars(dockerfile_knob.default):
            raise r.need(dockerfile_knob.line, "Dockerfile", f"default {dockerfile_knob.default} is not a path")
        arches[arch] = ArchSpec(
            arch=arch, uname=_UNAME.get(arch, arch), dockerfile=dockerfile_knob.default,
            kaniko_platform=f"linux/{arch}", tag_suffix="", default_wheel_source=ws_knob.default, line=0,
            lines={"dockerfile": dockerfile_knob.line, "default_wheel_source": ws_knob.line},
            dockerfile_origin="script default",
            dockerfile_why=f"the script has no architecture table; {dockerfile_knob.env} defaults to "
                           f"{dockerfile_knob.default} ({r.path}:{dockerfile_knob.line})")
        return arches, field_vars

    case_node, arms = table
    for pattern, pats, arm_line, settings in arms:
        values = {k: v for k, (v, _) in settings.items()}
        at = {k: ln for k, (_, ln) in settings.items()}
        plat = [(k, v) for k, v in values.items() if re.fullmatch(r"linux/[a-z0-9_]+(/v[0-9]+)?", v)]
        spec_lines = dict(at)
        if plat:
            pvar, platform = plat[0]
            field_vars[pvar] = "kaniko_platform"
            spec_lines["kaniko_platform"] = at[pvar]
        elif any(p in _ARCH_OF for p in pats):
            # kaniko builds for the host it runs on: the arm's `uname -m` value is the platform
            platform = f"linux/{_ARCH_OF[next(p for p in pats if p in _ARCH_OF)]}"
            spec_lines["kaniko_platform"] = arm_line
        else:
            raise r.need(arm_line, "build platform", f"no setting of the `{pattern})` arm has a `linux/<arch>` value "
                         "and its `uname -m` value is not a known machine")
        arch = platform.split("/")[1]
        manifest = next(((k, v) for k, v in values.items() if re.fullmatch(r"linux_[a-z0-9_]+", v)), None)
        if manifest:
            field_vars[manifest[0]] = "manifest_platform"
            spec_lines["manifest_platform"] = at[manifest[0]]
        crane = next(((k, v) for k, v in values.items() if "CRANE" in k.upper()), None)
        if crane:
            field_vars[crane[0]] = "crane_asset"

        suffix_vars = [v for v in tag_vars if v in values]
        if len(suffix_vars) == 1:
            tag_suffix = values[suffix_vars[0]]
            field_vars[suffix_vars[0]] = "tag_suffix"
            spec_lines["tag_suffix"] = at[suffix_vars[0]]
        elif suffix_vars:  # several table values in the tag: the suffix is what follows the sha
            tail = re.split(r"\$\{?GITSHA\}?", tag)[-1]
            try:
                tag_suffix = render(tail, values)
            except KeyError:
                tag_suffix = "".join(values[v] for v in suffix_vars)
            spec_lines["tag_suffix"] = at[suffix_vars[0]]
        elif len(arms) == 1:
            tag_suffix = ""
        else:
            raise r.need(arm_line, "tag suffix",
                         f"the image tag {tag} expands none of the `{pattern})` arm's settings "
                         f"({', '.join(values)}); one must keep architectures apart")

        table_ws = [v for v in ws_vars if v in values]
        if table_ws:
            default_ws = values[table_ws[0]]
            field_vars[table_ws[0]] = "default_wheel_source"
            spec_lines["default_wheel_source"] = at[table_ws[0]]
        elif not ws_vars:
            default_ws = ws_knob.default
            spec_lines["default_wheel_source"] = ws_knob.line
        else:
            raise r.need(ws_knob.line, "default wheel source",
                         f"{ws_knob.env} defaults to {ws_knob.default}, which the `{pattern})` arm does not set")

        table_df = [v for v in df_vars if v in values]
        if table_df:
            dockerfile, origin = values[table_df[0]], "arch table"
            field_vars[table_df[0]] = "dockerfile"
            spec_lines["dockerfile"] = at[table_df[0]]
            why = f"the `{pattern})` arm sets {table_df[0]}={dockerfile} ({r.path}:{at[table_df[0]]})"
        elif dockerfile_knob is not None and not template_vars(dockerfile_knob.default):
            dockerfile, origin = dockerfile_knob.default, "script default"
            spec_lines["dockerfile"] = dockerfile_knob.line
            why = (f"the arch table sets no Dockerfile; {dockerfile_knob.env} defaults to {dockerfile} on every "
                   f"host ({r.path}:{dockerfile_knob.line})")
        else:
            raise r.need(dockerfile_knob.line if dockerfile_knob else arm_line, "Dockerfile",
                         f"the Dockerfile passed to the executor is not a literal default nor set by the `{pattern})` arm")
        if arch in arches:
            raise r.need(arm_line, "build platform", f"two arms build {platform}")
        arches[arch] = ArchSpec(
            arch=arch, uname=pattern, dockerfile=dockerfile, kaniko_platform=platform,
            manifest_platform=manifest[1] if manifest else None, crane_asset=crane[1] if crane else None,
            tag_suffix=tag_suffix, default_wheel_source=default_ws, line=arm_line, settings=values,
            lines=spec_lines, dockerfile_origin=origin, dockerfile_why=why)
    if not arches:
        raise r.need(line(case_node), "build architecture", "the `uname -m` table has no architecture arm")
    suffixes = [a.tag_suffix for a in arches.values()]
    if len(set(suffixes)) != len(suffixes):
        raise ContractError(r.path, line(case_node), "a distinct image tag suffix per architecture (one shared "
                            "tag means one architecture's push overwrites the other's)", ", ".join(map(repr, suffixes)))
    return arches, field_vars


def _pins(r: _Reader, lines: dict[str, int]):
    found = r.pin_loop()
    if found is None:
        pin_lists = [a for a in r.assigns if "PIN" in a.name.upper()]
        if pin_lists:  # a pin list nobody reads: the loop has a shape this reader does not know
            raise r.need(pin_lists[0].stmt.line, "pinned ARGs",
                         f"${pin_lists[0].name} is assigned but no loop reads `ARG NAME=` lines for it")
        return [], [], None, "pin", None  # the script checks no pins against the Dockerfile
    loop, loop_var = found
    items = [c for i, c in enumerate(loop.children) if loop.field_name_for_child(i) == "value"]
    pinned: list[str] = []
    conditional: list[ConditionalPin] = []
    list_var = _var_ref(word_text(items[0]).replace("[@]", "").replace("[*]", "")) if len(items) == 1 else None
    if list_var is None:
        pinned = [word_text(i) for i in items]
        lines["pinned_args"] = line(loop)
    else:
        for a in r.assigns:
            if a.name != list_var or a.value is None:
                continue
            if a.value.type == "array":
                names = [word_text(w) for w in a.value.named_children if w.type != "comment"]
            else:
                names = a.text.split()
            names = [n for n in names if not n.startswith("$")]
            if a.stmt.guards:
                conditional.extend(ConditionalPin(name=n, when=list(a.stmt.guards), line=a.stmt.line) for n in names)
            else:
                if not a.append:
                    pinned = []
                    lines["pinned_args"] = a.stmt.line
                pinned.extend(names)
        if not pinned:
            raise r.need(line(loop), "pinned ARGs", f"no unconditional assignment of ${list_var}, the list the pin loop reads")
    for n in pinned + [p.name for p in conditional]:
        if not re.fullmatch(r"[A-Z][A-Z0-9_]*", n):
            raise r.need(line(loop), "pinned ARGs", f"{n!r} is not an ARG name")
    echo = value_var = None
    body = loop.child_by_field_name("body")
    if body is not None:
        inner = list(statements(body))
        for s in inner:
            for p in printed_lines(s):
                if loop_var in template_vars(p.template):
                    echo = p.template
                    break
            if echo:
                break
        if echo:
            assigned = [a.name for s in inner for a in _assignments(s)]
            value_var = next((v for v in template_vars(echo) if v != loop_var and v in assigned), None)
    return pinned, conditional, echo, loop_var, value_var


def _credentials(r: _Reader, required: list[RequiredVar], lines: dict[str, int]) -> tuple[str | None, str]:
    always = [x.name for x in required if x.always]
    user = token = None
    for n in r.nodes:
        if n.type == "command" and command_name(n) == "printf" and not r._in_function(n):
            args = command_args(n)
            if len(args) >= 3 and word_text(args[0]) == "%s:%s":
                user, token = _var_ref(word_text(args[1])), _var_ref(word_text(args[2]))
                break
    if token is None:
        token = next((n for n in always if re.search(r"(TOKEN|PASSWORD|PAT)$", n)), None)
        user = next((n for n in always if "USER" in n and n != token), None)
    if token is None:
        raise r.need(0, "registry credential", "no `printf '%s:%s' user token` and no required *_TOKEN variable")
    req = {x.name: x for x in required}
    if token not in req:
        raise ContractError(r.path, 0, f'`: "${{{token}:?...}}"` (the registry token is used but not required)')
    lines["credential_token"] = req[token].line
    if user and user in req:
        lines["credential_user"] = req[user].line
    set_x = next((s.line for s in r.stmts if s.node.type == "command" and command_name(s.node) == "set"
                  and any(re.fullmatch(r"-[a-z]*x[a-z]*", word_text(a)) for a in command_args(s.node))), None)
    if set_x is not None:
        unset = next((s.line for s in r.stmts if s.node.type == "unset_command"
                      and token in [word_text(c) for c in s.node.named_children]), None)
        if unset is None or unset > set_x:
            raise ContractError(r.path, set_x, f"`unset {token}` before `set -x` (the token would reach the log)")
    return user, token


def _task_guard(r: _Reader) -> str | None:
    """The variable whose absence makes the script refuse to run outside an Iris task (`-z "${IRIS_TASK_ID:-}"`)."""
    for node in r.nodes:
        if node.type != "if_statement":
            continue
        if not re.search(r"\bexit\s+[1-9]", src(node)):
            continue
        for i, c in enumerate(node.children):
            if node.field_name_for_child(i) != "condition":
                continue
            for n in descendants(c):
                if n.type == "unary_expression" and src(n).startswith("-z"):
                    exp = next((x for x in descendants(n) if x.type == "expansion"), None)
                    if exp is not None:
                        var, op, operand = expansion_parts(exp)
                        if var and op in (":-", "-") and not operand:
                            return var
    return None


__all__ = ["PARSER", "SCRIPT_PATH", "parse_script", "pattern_vars", "render", "shell_values"]
