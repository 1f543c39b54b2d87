"""Bash syntax trees for the build contract: the build script and every Dockerfile RUN step.

Why tree-sitter-bash: the upstream script is ordinary, evolving bash (arrays, `+=` appends, `[[ ]]`,
`&&`/`||` guards, case tables, heredocs). A real grammar gives every command with its exact place in
the `if`/`case`/`&&` structure, so the contract readers ask "which branch is this requirement in"
instead of matching line shapes; a construct they do not look at cannot confuse them. tree-sitter is
a maintained incremental parser with a pure-Python binding (no subprocess, so this stays pure domain
logic) and reports syntax errors as ERROR nodes, which we turn into a `file:line` refusal.

``statements(root)`` yields every simple command with the guards it runs under; ``test_guard`` turns a
`[ ... ]` / `[[ ... ]]` expression into a decidable Guard (or an opaque one, kept as readable text).
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from functools import cache
from itertools import product

import tree_sitter_bash
from tree_sitter import Language, Node, Parser

from domain.contract.errors import ContractError
from domain.contract.models import Condition, Guard

WILDCARD = "$(…)"  # a runtime value in a marker template (markers turn it into `.*?`)


@cache
def _parser() -> Parser:
    return Parser(Language(tree_sitter_bash.language()))


def parse_bash(text: str, path: str, line_offset: int = 0) -> Node:
    """The syntax tree of ``text``; a syntax error outside function bodies fails closed at its line."""
    root = _parser().parse(text.encode()).root_node
    if root.has_error:
        bad = _first_error(root)
        if bad is not None:
            row = bad.start_point[0]
            detail = "a syntax error here"
            # An unclosed quote shows up far below where it opens: name the first quoted string that
            # runs over several lines up to the error, which is where bash's own reader went astray.
            opened = next((n for n in descendants(root) if n.type in ("string", "raw_string")
                           and n.start_point[0] < n.end_point[0] and n.start_point[0] < row), None)
            if opened is not None:
                detail = f"a syntax error: a quote opened here is still open at line {row + 1 + line_offset}"
                row = opened.start_point[0]
            lines = text.splitlines()
            snippet = lines[row].strip() if row < len(lines) else ""
            raise ContractError(
                path, row + 1 + line_offset, f"bash that tree-sitter-bash can parse ({detail}; if `bash -n` "
                "accepts the file, the parser in domain/contract/shell.py needs attention)", snippet)
    return root


def _first_error(node: Node) -> Node | None:
    if node.type == "function_definition":
        return None  # a function body runs only when called; readers that need one parse it themselves
    if node.type == "ERROR" or node.is_missing:
        return node
    for c in node.children:
        if c.has_error or c.is_missing or c.type == "ERROR":
            found = _first_error(c)
            if found is not None:
                return found
    return None


def line(node: Node) -> int:
    return node.start_point[0] + 1


def src(node: Node) -> str:
    return node.text.decode()


# ----------------------------------------------------------------------------- words


def word_text(node: Node) -> str:
    """A word as the shell sees it before expansion: quotes removed, `$VAR` / `${...}` / `$(...)` kept."""
    t = node.type
    if t == "string":
        inner = src(node)[1:-1]
        return re.sub(r'\\([\\"`$])', r"\1", inner)
    if t == "raw_string":
        return src(node)[1:-1]
    if t == "ansi_c_string":
        return src(node)[2:-1]
    if t == "concatenation":
        return "".join(word_text(c) for c in node.children)
    if t == "word":
        return re.sub(r"\\(.)", r"\1", src(node))
    return src(node)


def is_literal(node: Node) -> bool:
    """True when the word holds no expansion (its value is its text)."""
    return not any(n.type in ("simple_expansion", "expansion", "command_substitution", "process_substitution",
                              "arithmetic_expansion") for n in descendants(node))


def descendants(node: Node) -> Iterator[Node]:
    yield node
    for c in node.children:
        yield from descendants(c)


def expansion_parts(node: Node) -> tuple[str | None, str | None, str | None]:
    """(variable, operator, operand text) of an `expansion` node like `${VAR:-default}`."""
    var = op = None
    operand_start = None
    for c in node.children:
        if c.type == "variable_name" and var is None:
            var = src(c)
        elif node.field_name_for_child(node.children.index(c)) == "operator" and op is None and var is not None:
            op = src(c)
            operand_start = c.end_byte
    if op is None or operand_start is None:
        return var, op, None
    base = node.start_byte
    text = node.text.decode()
    return var, op, text[operand_start - base: len(text) - 1]


def referenced_vars(node: Node) -> list[str]:
    """Variable names a word expands (`$X`, `${X...}`), in order."""
    out: list[str] = []
    for n in descendants(node):
        if n.type in ("simple_expansion", "expansion"):
            v = next((c for c in n.children if c.type == "variable_name"), None)
            if v is not None:
                out.append(src(v))
    return out


def template_vars(template: str) -> list[str]:
    """Variable names a template string expands (`$X`, `${X...}`)."""
    return [a or b for a, b in re.findall(r"\$\{!?([A-Za-z_][A-Za-z0-9_]*)[^}]*\}|\$([A-Za-z_][A-Za-z0-9_]*)", template)]


# ----------------------------------------------------------------------------- conditions


def _operand_var(node: Node) -> tuple[str, str | None] | None:
    """`"$X"`, `$X`, `"${X}"`, `"${X:-d}"` → (X, default); anything else → None."""
    n = node
    if n.type == "string":
        parts = [c for c in n.children if c.type not in ('"',)]
        if len(parts) != 1:
            return None
        n = parts[0]
    if n.type == "simple_expansion":
        v = next((c for c in n.children if c.type == "variable_name"), None)
        return (src(v), None) if v is not None else None
    if n.type == "expansion":
        var, op, operand = expansion_parts(n)
        if var is None or src(n).startswith("${!") or src(n).startswith("${#"):
            return None
        if op is None:
            return var, None
        if op in (":-", "-"):
            return var, operand or ""
    return None


def _operand_literal(node: Node) -> str | None:
    if node.type in ("word", "string", "raw_string", "extglob_pattern", "number", "concatenation") and is_literal(node):
        return word_text(node)
    return None


DNF = list[list[Condition]]


def _test_dnf(node: Node) -> DNF | None:
    """A test expression in disjunctive normal form, or None when it is not decidable from variables."""
    t = node.type
    if t in ("test_command",):
        inner = [c for c in node.children if c.type not in ("[", "]", "[[", "]]")]
        return _test_dnf(inner[0]) if len(inner) == 1 else None
    if t == "parenthesized_expression":
        inner = [c for c in node.children if c.type not in ("(", ")")]
        return _test_dnf(inner[0]) if len(inner) == 1 else None
    if t == "binary_expression":
        left, right = node.child_by_field_name("left"), node.child_by_field_name("right")
        op = node.child_by_field_name("operator")
        if left is None or right is None or op is None:
            return None
        o = src(op)
        if o in ("&&", "-a"):
            a, b = _test_dnf(left), _test_dnf(right)
            return None if a is None or b is None else [x + y for x, y in product(a, b)]
        if o in ("||", "-o"):
            a, b = _test_dnf(left), _test_dnf(right)
            return None if a is None or b is None else a + b
        if o in ("=", "==", "!="):
            var = _operand_var(left)
            value = _operand_literal(right)
            if var is None or value is None or any(ch in value for ch in "*?["):
                return None  # a glob or a variable on the right: not a plain comparison
            return [[Condition(var=var[0], op="!=" if o == "!=" else "=", value=value, default=var[1])]]
        return None
    if t == "unary_expression":
        op = node.child_by_field_name("operator")
        operand = next((c for c in node.children if c != op), None)
        if op is None or operand is None:
            return None
        o = src(op)
        if o == "!":
            inner = _test_dnf(operand)
            return None if inner is None else negate(inner)
        if o in ("-n", "-z"):
            var = _operand_var(operand)
            if var is None:
                return None
            return [[Condition(var=var[0], op=o, default=var[1])]]  # type: ignore[arg-type]
        return None
    if t == "negated_command":
        inner = next((c for c in node.children if c.type != "!"), None)
        d = _test_dnf(inner) if inner is not None else None
        return None if d is None else negate(d)
    if t == "list":
        kids = [c for c in node.children]
        if len(kids) == 3 and src(kids[1]) in ("&&", "||"):
            a, b = _test_dnf(kids[0]), _test_dnf(kids[2])
            if a is None or b is None:
                return None
            return [x + y for x, y in product(a, b)] if src(kids[1]) == "&&" else a + b
    return None


def negate(dnf: DNF) -> DNF:
    """not (A or B) = not A and not B; each conjunction becomes a disjunction of negated atoms."""
    per_clause = [[c.negated() for c in clause] for clause in dnf]
    return [list(combo) for combo in product(*per_clause)]


def guard_of(node: Node) -> Guard:
    dnf = _test_dnf(node)
    text = " ".join(src(node).split())
    if dnf is None:
        return Guard(opaque=text)
    return Guard.from_dnf(dnf, text=text)


def negated_guard(g: Guard) -> Guard:
    if g.opaque is not None:
        return Guard(opaque=f"not ({g.opaque})")
    return Guard.from_dnf(negate(g.dnf()), text=f"not ({g.text})" if g.text else None)


# ----------------------------------------------------------------------------- statements


@dataclass
class Stmt:
    """One simple command (or assignment) with the branch it runs in."""

    node: Node
    guards: list[Guard]
    loops: list[Node] = field(default_factory=list)  # enclosing for/while statements, outermost first
    redirected: bool = False  # stdout goes to a file or a pipe (an echo here prints no log line)
    case_arms: list[tuple[Node, Node]] = field(default_factory=list)  # (case_statement, case_item)

    @property
    def line(self) -> int:
        return line(self.node)

    @property
    def in_loop(self) -> bool:
        return bool(self.loops)


_LEAF = {"command", "variable_assignment", "variable_assignments", "declaration_command", "unset_command",
         "test_command"}
_SEQUENCE = {"program", "compound_statement", "do_group", "subshell"}


def _is_test(node: Node) -> bool:
    return node.type == "test_command" or (
        node.type == "negated_command" and any(c.type == "test_command" for c in node.children))


def _success_guards(node: Node) -> list[Guard]:
    """Guards that hold once ``node`` succeeded (a failing command stops the script: no guard)."""
    if _is_test(node):
        return [guard_of(node)]
    if node.type == "list":
        kids = node.children
        if len(kids) == 3 and src(kids[1]) == "&&":
            return _success_guards(kids[0]) + _success_guards(kids[2])
        if len(kids) == 3 and src(kids[1]) == "||":
            return [guard_of(node)]
    return []


def _failure_guards(node: Node) -> list[Guard]:
    if _is_test(node):
        return [negated_guard(guard_of(node))]
    return [Guard(opaque=f"`{' '.join(src(node).split())[:80]}` failed")]


def _redirects_stdout(node: Node) -> bool:
    """True when stdout leaves the log: `> file`, `>> file`, `>&2`, `&> file` (not `2>`, `2>&1`, `<`)."""
    for c in node.children:
        if c.type == "file_redirect":
            text = src(c).lstrip()
            if text.startswith("<") or re.match(r"^[02-9]\s*[<>]", text):
                continue
            return True
    return False


def statements(root: Node) -> Iterator[Stmt]:
    """Every simple command under ``root`` with its if/elif/else/case/&&/|| guards (functions skipped)."""
    yield from _walk(root, [], [], False, [])


def _walk(node: Node, guards: list[Guard], loops: list[Node], redirected: bool,
          arms: list[tuple[Node, Node]]) -> Iterator[Stmt]:
    t = node.type
    if t in _SEQUENCE:
        for c in node.named_children:
            yield from _walk(c, guards, loops, redirected, arms)
    elif t in _LEAF:
        yield Stmt(node, list(guards), list(loops), redirected, list(arms))
    elif t == "redirected_statement":
        body = node.child_by_field_name("body")
        out = redirected or _redirects_stdout(node)
        if body is None:
            return
        if body.type in _LEAF:
            yield Stmt(body, list(guards), list(loops), out, list(arms))
            # the heredoc (if any) is reached through the statement's parent
        else:
            yield from _walk(body, guards, loops, out, arms)
    elif t == "list":
        kids = node.children
        if len(kids) == 3 and src(kids[1]) in ("&&", "||"):
            yield from _walk(kids[0], guards, loops, redirected, arms)
            extra = _success_guards(kids[0]) if src(kids[1]) == "&&" else _failure_guards(kids[0])
            yield from _walk(kids[2], guards + extra, loops, redirected, arms)
        else:
            for c in node.named_children:
                yield from _walk(c, guards, loops, redirected, arms)
    elif t == "pipeline":
        named = node.named_children
        for i, c in enumerate(named):
            yield from _walk(c, guards, loops, redirected or i < len(named) - 1, arms)
    elif t == "negated_command":
        for c in node.named_children:
            yield from _walk(c, guards, loops, redirected, arms)
    elif t == "if_statement":
        yield from _walk_if(node, guards, loops, redirected, arms)
    elif t == "case_statement":
        value = node.child_by_field_name("value")
        var = _operand_var(value) if value is not None else None
        for item in (c for c in node.named_children if c.type == "case_item"):
            pats = [c for i, c in enumerate(item.children) if item.field_name_for_child(i) == "value"]
            body_start = next((i for i, c in enumerate(item.children) if c.type == ")"), -1) + 1
            g = _case_guard(var, pats, value)
            for c in item.children[body_start:]:
                if c.is_named and c.type not in ("comment",):
                    yield from _walk(c, guards + [g], loops, redirected, arms + [(node, item)])
    elif t in ("for_statement", "c_style_for_statement", "while_statement"):
        body = node.child_by_field_name("body")
        if body is not None:
            yield from _walk(body, guards, loops + [node], redirected, arms)
    # function_definition, comment, heredoc bodies: not run here


def _case_guard(var: tuple[str, str | None] | None, pats: list[Node], value: Node | None) -> Guard:
    texts = [src(p) for p in pats]
    readable = f"{src(value) if value is not None else '?'} matches {'|'.join(texts)}"
    if var is None or any(not re.fullmatch(r"[A-Za-z0-9_.\-/:]+", p) for p in texts):
        return Guard(opaque=readable)
    return Guard.from_dnf([[Condition(var=var[0], op="=", value=p, default=var[1])] for p in texts], text=readable)


def _walk_if(node: Node, guards: list[Guard], loops: list[Node], redirected: bool,
             arms: list[tuple[Node, Node]]) -> Iterator[Stmt]:
    for here, body in if_clauses(node):
        for stmt in body:
            yield from _walk(stmt, guards + here, loops, redirected, arms)


def if_clauses(node: Node) -> list[tuple[list[Guard], list[Node]]]:
    """The branches of an `if_statement`: each body (its statements, comments left out) with the conditions under
    which it runs (its own test, and every earlier test negated; `else`: the earlier ones negated)."""
    clauses: list[tuple[Guard | None, list[Node]]] = []
    cond_nodes: list[Node] = []
    body: list[Node] = []
    for i, c in enumerate(node.children):
        fname = node.field_name_for_child(i)
        if fname == "condition":
            if c.is_named:
                cond_nodes.append(c)
        elif c.type in ("elif_clause", "else_clause"):
            continue
        elif c.is_named and c.type != "comment":
            body.append(c)
    clauses.append((_cond_guard(cond_nodes), body))
    for c in node.named_children:
        if c.type == "elif_clause":
            conds, b = [], []
            seen_then = False
            for cc in c.children:
                if cc.type == "then":
                    seen_then = True
                elif cc.is_named and cc.type != "comment":
                    (b if seen_then else conds).append(cc)
            clauses.append((_cond_guard(conds), b))
        elif c.type == "else_clause":
            clauses.append((None, [cc for cc in c.named_children if cc.type != "comment"]))
    out: list[tuple[list[Guard], list[Node]]] = []
    prior: list[Guard] = []
    for g, b in clauses:
        out.append((prior + ([g] if g is not None else []), b))
        if g is not None:
            prior = prior + [negated_guard(g)]
    return out


def _cond_guard(conds: list[Node]) -> Guard:
    if len(conds) == 1:
        n = conds[0]
        if _is_test(n) or n.type == "list":
            g = guard_of(n)
            return g
        return Guard(opaque=f"`{' '.join(src(n).split())[:80]}` succeeds")
    return Guard(opaque=" ".join(" ".join(src(n).split()) for n in conds))


# ----------------------------------------------------------------------------- commands


def command_name(node: Node) -> str | None:
    if node.type != "command":
        return None
    n = node.child_by_field_name("name")
    return word_text(n) if n is not None else None


def command_args(node: Node) -> list[Node]:
    return [c for i, c in enumerate(node.children) if node.field_name_for_child(i) == "argument"]


def functions(root: Node) -> dict[str, Node]:
    out: dict[str, Node] = {}
    for n in descendants(root):
        if n.type == "function_definition":
            name = n.child_by_field_name("name")
            if name is not None:
                out.setdefault(src(name), n)
    return out


def heredoc_body(stmt_node: Node) -> str | None:
    """The heredoc text fed to the command ``stmt_node`` (when its parent redirects one)."""
    parent = stmt_node.parent
    if parent is None or parent.type != "redirected_statement":
        return None
    for c in descendants(parent):
        if c.type == "heredoc_body":
            return src(c)
    return None


# ----------------------------------------------------------------------------- log markers


@dataclass
class Printed:
    """A line a command prints to the log: ``template`` is shell text (`$VAR` kept, WILDCARD for runtime)."""

    template: str
    source_text: str  # as written in the file (what a kaniko cache-hit line quotes)


def printed_lines(stmt: Stmt) -> list[Printed]:
    """Log lines a statement prints: `echo ...` and the print() calls of `python -c "..."` / `python - <<EOF`."""
    node = stmt.node
    name = command_name(node)
    if name is None or stmt.redirected:
        return []
    args = command_args(node)
    if name == "echo":
        words = [a for a in args]
        while words and re.fullmatch(r"-[neE]+", src(words[0])):
            if "n" in src(words[0]) or "e" in src(words[0]):
                return []
            words = words[1:]
        if not words:
            return []
        text = " ".join(word_text(w) for w in words)
        raw = " ".join(_inner(w) for w in words)
        return [Printed(template=text, source_text=raw)]
    if re.search(r"(^|/)python[0-9.]*$", name):
        texts = [src(a) for a in args]
        if "-c" in texts:
            i = texts.index("-c")
            if i + 1 < len(args):
                return python_prints(word_text(args[i + 1]))
        if "-" in texts:
            body = heredoc_body(node)
            if body is not None:
                return python_prints(body)
    return []


def _inner(w: Node) -> str:
    s = src(w)
    if w.type in ("string", "raw_string") and len(s) >= 2:
        return s[1:-1]
    return s


def python_prints(code: str) -> list[Printed]:
    """Each print() to stdout in ``code`` as a template: string constants kept, other values WILDCARD.

    Why Python's own parser: the assertions are real Python (`print('torch', torch.__version__)`,
    f-strings); `ast` gives the argument list exactly, and code it cannot parse prints nothing we claim.
    """
    try:
        tree = ast.parse(code)
    except SyntaxError:
        return []
    out: list[Printed] = []
    for n in ast.walk(tree):
        if not (isinstance(n, ast.Call) and isinstance(n.func, ast.Name) and n.func.id == "print"):
            continue
        kw = {k.arg: k.value for k in n.keywords}
        if "file" in kw or any(isinstance(a, ast.Starred) for a in n.args):
            continue
        sep = kw.get("sep")
        if sep is not None and not (isinstance(sep, ast.Constant) and isinstance(sep.value, str)):
            continue
        joiner = sep.value if isinstance(sep, ast.Constant) else " "
        parts = [_py_text(a) for a in n.args]
        template = joiner.join(parts)
        if not template.replace(WILDCARD, "").strip():
            continue  # prints only runtime values: nothing to recognize it by
        out.append(Printed(template=template, source_text=ast.get_source_segment(code, n) or template))
    return out


def _py_text(node: ast.expr) -> str:
    if isinstance(node, ast.Constant):
        return str(node.value)
    if isinstance(node, ast.JoinedStr):
        return "".join(str(v.value) if isinstance(v, ast.Constant) else WILDCARD for v in node.values)
    if (isinstance(node, ast.BinOp) and isinstance(node.op, ast.Mod) and isinstance(node.left, ast.Constant)
            and isinstance(node.left.value, str)):  # 'torch %s' % v
        return re.sub(r"%[-#0 +]*[0-9.*]*[a-zA-Z]", lambda _m: WILDCARD, node.left.value.replace("%%", "\0")
                      ).replace("\0", "%")
    if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "format"
            and isinstance(node.func.value, ast.Constant) and isinstance(node.func.value.value, str)):
        return re.sub(r"\{[^{}]*\}", lambda _m: WILDCARD, node.func.value.value)  # 'torch {}'.format(v)
    return WILDCARD


__all__ = ["WILDCARD", "Printed", "Stmt", "command_args", "command_name", "descendants",
           "expansion_parts", "functions", "guard_of", "heredoc_body", "is_literal", "line", "negate",
           "negated_guard", "parse_bash", "printed_lines", "python_prints", "referenced_vars", "src", "statements",
           "template_vars", "word_text"]
