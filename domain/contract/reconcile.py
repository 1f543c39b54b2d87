"""Where the ops doc disagrees with the script (the script wins), and the corrected ops text.

Why: the runbook says prose outranked by the script must be corrected in the same change, so the
service reports each disagreement and proposes the corrected doc for the build commit. The most
common real drift is a renamed credential (era C's doc still says ``DOCKER_USER_ID``/``GHCR_TOKEN``
where the script reads ``REGISTRY_USER``/``REGISTRY_TOKEN``): it is corrected by renaming the word
throughout the doc, so table rows, ``-e`` pairs and the commands that set them stay consistent.
"""

from __future__ import annotations

import re

from pydantic import BaseModel, Field

from domain.contract.errors import ContractError
from domain.contract.models import ContractRow, Disagreement, EnvPair, OpsContract, ScriptContract


def _when(req) -> str:
    return "always" if req.always else " and ".join(map(str, req.when))


def _requirements(script: ScriptContract) -> dict[str, tuple[str, int]]:
    """name -> (when, first line): several `${VAR:?}` of one name read "A or B" (always if any is)."""
    out: dict[str, tuple[list[str], int]] = {}
    for r in script.required:
        whens, line = out.setdefault(r.name, ([], r.line))
        if _when(r) not in whens:
            whens.append(_when(r))
    return {n: ("always" if "always" in w else " or ".join(w), line) for n, (w, line) in out.items()}


def script_inputs(script: ScriptContract) -> set[str]:
    """Every environment variable the script reads (required, optional knobs, named roles)."""
    names = {r.name for r in script.required} | set(script.knobs)
    for attr in ("credential_user_var", "credential_token_var", "image_repository_var", "wheel_source_var",
                 "megatron_var", "floating_var", "preserve_wheels_var", "dockerfile_var", "tag_prefix_var",
                 "uname_override_var", "task_guard_var"):
        if value := getattr(script, attr, None):
            names.add(value)
    return names


def _row_agrees(row: ContractRow, want: str) -> bool:
    """Does a required row's condition say what the script requires (``want``, e.g. "always", "A or B")?"""
    text = " ".join(row.required_when.replace("`", "").split())
    if row.always:
        return want == "always"
    if text.startswith(want):
        return True  # written exactly as the service writes it (a corrected row stays corrected)
    if re.search(r"\b(or|and)\b", want):
        return False
    return want == " and ".join(str(c) for c in row.when)


def _role(name: str) -> str | None:
    if re.search(r"TOKEN|PASSWORD|PAT\b|SECRET", name):
        return "token"
    if re.search(r"USER|LOGIN|USERNAME", name):
        return "user"
    return None


def _prose_names(ops: OpsContract) -> list[str]:
    names = [r.variable for r in ops.contract_rows]
    for t in ops.templates.values():
        names += [e.name for e in t.env]
    return list(dict.fromkeys(names))


def credential_renames(script: ScriptContract, ops: OpsContract, text: str) -> dict[str, str]:
    """Stale credential names in the prose -> the script's names (same role, new name absent from the doc)."""
    reads = script_inputs(script)
    wanted = {"user": script.credential_user_var, "token": script.credential_token_var}
    out: dict[str, str] = {}
    for name in _prose_names(ops):
        role = _role(name)
        new = wanted.get(role) if role else None
        if (name not in reads and new and new != name and new not in out.values()
                and not re.search(rf"\b{re.escape(new)}\b", text)):
            out[name] = new
    return out


def find_disagreements(script: ScriptContract, ops: OpsContract, text: str = "") -> list[Disagreement]:
    out: list[Disagreement] = []
    renames = credential_renames(script, ops, text)
    reqs = _requirements(script)
    reads = script_inputs(script)
    documented = {renames.get(r.variable, r.variable) for r in ops.contract_rows}
    for row in ops.contract_rows:
        name = renames.get(row.variable, row.variable)
        req = reqs.get(name)
        field = f"build contract: {row.variable}"
        where = f"{ops.path}:{row.line}"
        if row.variable in renames:
            out.append(Disagreement(
                file=ops.path, field=field, prose_value=row.variable, prose_source=where,
                script_value=f"the script reads {name}, not {row.variable}",
                resolution=f"script wins: rename {row.variable} to {name} throughout the ops doc"))
        if not row.understood:
            continue
        if row.always or row.when:
            prose = "required " + ("always" if row.always else " and ".join(str(c) for c in row.when))
            if req is None:
                out.append(Disagreement(
                    file=ops.path, field=field, prose_value=prose, prose_source=where,
                    script_value="not required by the script",
                    resolution=f"script wins: drop the {row.variable} row from the build-contract table"))
            elif not _row_agrees(row, req[0]):
                out.append(Disagreement(
                    file=ops.path, field=field, prose_value=prose, prose_source=where,
                    script_value=f"required {req[0]}", other_source=f"{script.path}:{req[1]}",
                    resolution=f"script wins: set 'required when' of {name} to {req[0]}"))
        elif row.optional_default is not None:
            knob = script.knobs.get(name)
            if knob is None:
                if req is not None:
                    out.append(Disagreement(
                        file=ops.path, field=field, prose_value="optional", prose_source=where,
                        script_value="required", other_source=f"{script.path}:{req[1]}",
                        resolution=f"script wins: mark {name} required"))
                continue
            if row.optional_default and not knob.default.startswith("$") and row.optional_default != knob.default:
                out.append(Disagreement(
                    file=ops.path, field=field, prose_value=f"default {row.optional_default}", prose_source=where,
                    script_value=f"default {knob.default}", other_source=f"{script.path}:{knob.line}",
                    resolution=f"script wins: set the default of {name} to {knob.default}"))
    if ops.contract_rows:
        for name, (when, line) in _requirements(script).items():
            if name not in documented:
                out.append(Disagreement(
                    file=ops.path, field=f"build contract: {name}", prose_value="absent",
                    script_value=f"required {when}", other_source=f"{script.path}:{line}",
                    resolution=f"script wins: add a {name} row (required {when})"))
    for arch, p in ops.placements.items():
        if arch not in script.arches:
            out.append(Disagreement(
                file=ops.path, field=f"placement: {arch}", prose_value=f"{arch} on {p.cluster}", prose_source=f"{ops.path}:{p.line}",
                script_value=f"the script builds only {', '.join(sorted(script.arches))}",
                resolution=f"script wins: no {arch} build until the script supports it"))
    for arch, t in ops.templates.items():
        label = "every job" if arch == "*" else arch
        for e in t.env:
            if e.is_reference and e.name not in reads and e.name not in renames and e.value.strip("${}") == e.name:
                if any(e.name in c for c in t.command):
                    continue  # read by the job command (the base64 script carrier), not by the script
                out.append(Disagreement(
                    file=ops.path, field=f"launch {label}: -e {e.name}", prose_value="passed", prose_source=f"{ops.path}:{e.line}",
                    script_value="the script does not read it",
                    resolution=f"script wins: the service does not pass {e.name}"))
        if t.env:
            names = {renames.get(e.name, e.name) for e in t.env}
            for name in script.always_required:
                if name not in names and name != "GITSHA":
                    out.append(Disagreement(
                        file=ops.path, field=f"launch {label}: -e {name}", prose_value="absent",
                        script_value="required always",
                        resolution=f"script wins: the service passes {name}; add `-e {name} \"${name}\"` to the doc"))
    return out


def _row_line(n_cells: int, name: str, when: str, script_path: str) -> str:
    cells = [f"`{name}`", when] + [f"required by `{script_path}`"] + [""] * max(0, n_cells - 3)
    return "| " + " | ".join(cells[:max(n_cells, 2)]) + " |\n"


def _cells(line: str) -> int:
    return max(2, line.strip().strip("|").count("|") + 1)


class OpsCorrection(BaseModel):
    """One corrected line of the ops doc: where (1-based, in the doc at the base commit), what, why."""

    line: int
    before: str  # the line as it was ("" for an added line)
    after: str  # what replaces it ("" when removed; several lines when rows are added after it)
    why: str

    def describe(self, path: str) -> str:
        def q(x: str) -> str:
            x = " ⏎ ".join(p.strip() for p in x.splitlines())
            return f"`{x[:160]}{'…' if len(x) > 160 else ''}`" if x else ""
        if not self.before:
            return f"{path}:{self.line}: added after it {q(self.after)} ({self.why})"
        if not self.after:
            return f"{path}:{self.line}: removed {q(self.before)} ({self.why})"
        return f"{path}:{self.line}: {q(self.before)} → {q(self.after)} ({self.why})"


class OpsFix(BaseModel):
    text: str | None  # the corrected doc, None when nothing changes
    corrections: list[OpsCorrection] = Field(default_factory=list)


class UncorrectableProse(ContractError):
    """Stale prose the service reports but cannot rewrite safely: the plan is refused naming the line."""


_PAIR = r'-e\s+{name}\s+(?:"[^"]*"|\'[^\']*\'|[^\s\\]+)'
_ASSIGN = re.compile(r"\s*(?:export\s+)?([A-Z_][A-Z0-9_]*)=(\$\(.*\)|\"[^\"]*\"|'[^']*'|[^\s;&|]+)\s*")


def _replace_cell(line: str, old: str, new: str) -> str | None:
    m = re.search(rf"\|\s*{re.escape(old.strip())}\s*\|", line)
    return None if m is None else line[:m.start()] + f"| {new} |" + line[m.end():]


def launcher_sentences(text: str, protected: set[str] | list[str]) -> list[tuple[int, int, str, str]]:
    """Paragraphs (first line, last line, prefix-free content, the launcher path) whose sentences say the
    image digests live in a protected file (the Iris training launcher), which the runbook forbids."""
    from domain.contract.ops import _blocks

    out = []
    names = {p for p in protected if p}
    for b in _blocks(text):
        if b.kind != "para":
            continue
        for sentence in re.split(r"(?<=[.;!?])\s+", " ".join(b.text.split())):
            low = sentence.lower()
            if "digest" not in low or re.search(r"\b(not|never|no|forbid\w*|instead of)\b", low):
                continue
            hit = next((s for s in _code_spans(sentence) for p in names if s == p or p.endswith("/" + s)
                        or s.endswith("/" + p)), None)
            if hit and re.search(r"\bpin|\blive|\brecord|\bstor|\bkept|\bwritten|source of truth", low):
                out.append((b.line, b.end or b.line, b.text, next(p for p in names if p == hit or
                                                                    p.endswith("/" + hit) or hit.endswith("/" + p))))
                break
    return out


def _code_spans(s: str) -> list[str]:
    return re.findall(r"`([^`]+)`", s)


def _rewrite_launcher_paragraph(content: str, launcher: str, pin_table: str | None) -> str:
    where = (f"pinned in `{pin_table}` by the build's PR" if pin_table else
             "recorded with their validation evidence in the build's PR body and issue")
    new = (f"Deployed image digests are {where}, never in `{launcher}`: the runbook forbids adding digests "
           "to the Iris training launcher.")
    out, replaced = [], False
    for sentence in re.split(r"(?<=[.;!?])\s+", " ".join(content.split())):
        low = sentence.lower()
        if not replaced and "digest" in low and any(launcher.endswith(s) or s.endswith(launcher)
                                                    for s in _code_spans(sentence)):
            out.append(new)
            replaced = True
        elif replaced and not _code_spans(sentence) and re.search(r"digest|source of truth", low):
            continue  # "Single source of truth; do not copy a digest elsewhere.": the same stale rule
        else:
            out.append(sentence)
    return " ".join(out)


def correct_ops(script: ScriptContract, ops: OpsContract, text: str, *, pin_table: str | None = None,
                protected: set[str] | list[str] = (), megatron_env: list[EnvPair] | None = None) -> OpsFix:
    """The ops doc corrected to match the script and the runbook's rules, line by line with why.

    Every disagreement ``find_disagreements`` reports is corrected here, plus two runbook rules read by
    meaning: a variable a code block sets that nothing reads any more (era C's ``BUILD_B64``), and a
    sentence saying digests are pinned in a protected file (the training launcher). ``pin_table`` is
    where the digests go (None: the PR body and the issue). What cannot be rewritten safely raises
    ``UncorrectableProse`` naming the line; the result is re-read and must report nothing correctable.
    """
    if not ops.found or not text:
        return OpsFix(text=None)
    renames = credential_renames(script, ops, text)
    fixed = text
    for old, new in renames.items():
        fixed = re.sub(rf"\b{re.escape(old)}\b", new, fixed)
    original = text.splitlines(keepends=True)
    lines = fixed.splitlines(keepends=True)
    why: dict[int, list[str]] = {}

    def because(i: int, reason: str) -> None:
        if reason not in why.setdefault(i, []):
            why[i].append(reason)

    def refuse(line: int, what: str) -> None:
        raise UncorrectableProse(ops.path, line, "prose the service can correct", what)

    for i, line in enumerate(original):
        for old, new in renames.items():
            if re.search(rf"\b{re.escape(old)}\b", line):
                because(i, f"the script reads {new}, not {old}")
    reqs = _requirements(script)
    reads = script_inputs(script)
    drop: set[int] = set()
    keep: set[int] = set()
    rows: list[ContractRow] = [r for r in ops.contract_rows if r.understood]
    for row in rows:
        i = row.line - 1
        if i >= len(lines):
            continue
        name = renames.get(row.variable, row.variable)
        req = reqs.get(name)
        if row.always or row.when:
            if req is None:
                drop.add(i)
                because(i, f"the script does not require {name}")
                continue
            keep.add(i)
            if not _row_agrees(row, req[0]):
                new_line = _replace_cell(lines[i], row.required_when, req[0])
                if new_line is None:
                    refuse(row.line, f"the condition of {name} ({row.required_when!r}) should read "
                                     f"{req[0]!r} but its cell cannot be located")
                lines[i] = new_line
                because(i, f"the script requires {name} {req[0]} ({script.path}:{req[1]})")
        else:
            keep.add(i)
            knob = script.knobs.get(name)
            if knob is None and req is not None and row.optional_default is not None:
                new_line = _replace_cell(lines[i], row.required_when, req[0])
                if new_line is None:
                    refuse(row.line, f"{name} is marked optional but the script requires it ({req[0]})")
                lines[i] = new_line
                because(i, f"{name} is not optional: the script requires it {req[0]} ({script.path}:{req[1]})")
            elif row.optional_default and knob and not knob.default.startswith("$") and \
                    knob.default != row.optional_default:
                lines[i] = lines[i].replace(f"(default: {row.optional_default})", f"(default: {knob.default})", 1)
                because(i, f"the script's default of {name} is {knob.default} ({script.path}:{knob.line})")
    drop -= keep  # a line naming several variables stays while one of them is still right
    present = {renames.get(r.variable, r.variable) for r in ops.contract_rows}
    missing = {name: when for name, (when, _) in _requirements(script).items() if name not in present}
    extra: dict[int, str] = {}
    if missing and ops.contract_rows:
        last = max(r.line for r in ops.contract_rows) - 1
        n = _cells(lines[last])
        extra[last] = "".join(_row_line(n, name, when, script.path) for name, when in missing.items())
        because(last, "the script requires " + ", ".join(f"{k} ({w})" for k, w in missing.items()))
    for arch, p in ops.placements.items():
        if arch not in script.arches:
            drop.add(p.line - 1)
            because(p.line - 1, f"the script builds only {', '.join(sorted(script.arches))}")
    for d in tag_form_disagreements(script, ops, megatron_env) if megatron_env is not None else []:
        p = ops.placements[d.field.removeprefix("tag forms: ")]
        i = p.line - 1
        first, last = f"`{p.tag_forms[0]}`", f"`{p.tag_forms[-1]}`"
        a = lines[i].find(first)
        b = lines[i].find(last, a) + len(last) if a >= 0 and lines[i].find(last, a) >= 0 else -1
        if a < 0 or b < 0:
            refuse(p.line, f"the tag forms of {p.arch} should read {d.script_value} but the cell cannot be located")
        lines[i] = lines[i][:a] + ", ".join(f"`{f}`" for f in d.script_value.split(", ")) + lines[i][b:]
        because(i, f"the script derives the {p.arch} tags as {d.script_value} ({d.other_source})")
    _launch_env(script, ops, renames, reads, lines, extra, because, refuse)
    for i in _bundle_launch(script, ops, lines):
        because(i, f"the script finds files beside itself ({script.path}:{script.lines.get('self_location', 0)}): "
                   "the job runs the bundle's copy")
    _runbook_rules(script, ops, reads, lines, drop, because, pin_table, protected)
    out_lines = [(line if i not in drop else "") + extra.get(i, "") for i, line in enumerate(lines)]
    out = "".join(out_lines)
    if out == text:
        return OpsFix(text=None)
    corrections = []
    for i, (old, new) in enumerate(zip(original, out_lines, strict=False)):
        if old == new:
            continue
        reason = "; ".join(why.get(i, [])) or "corrected to match the script"
        if new.startswith(old) and i in extra:  # the line stays; rows are added after it
            corrections.append(OpsCorrection(line=i + 1, before="", after=new[len(old):], why=reason))
        else:
            corrections.append(OpsCorrection(line=i + 1, before=old, after=new, why=reason))
    _check_residual(script, ops, out, pin_table, protected, megatron_env)
    return OpsFix(text=out, corrections=corrections)


def _launch_env(script, ops, renames, reads, lines, extra, because, refuse) -> None:
    """`-e` pairs of the launch templates: drop what nothing reads, add what the script requires always."""
    for t in ops.templates.values():
        for e in t.env:
            if not (e.is_reference and e.name not in reads and e.name not in renames
                    and e.value.strip("${}") == e.name) or any(e.name in c for c in t.command):
                continue
            i = e.line - 1
            pat = _PAIR.format(name=re.escape(e.name))
            if i >= len(lines) or not re.search(pat, lines[i]):
                refuse(e.line, f"`-e {e.name}` is passed but nothing reads it, and the pair cannot be located")
            if re.fullmatch(rf"\s*{pat}\s*\\?\s*", lines[i]):
                if not lines[i].rstrip().endswith("\\"):
                    refuse(e.line, f"`-e {e.name}` ends the command; removing it would leave a dangling `\\`")
                lines[i] = ""
            else:
                lines[i] = re.sub(rf"\s*{pat}", "", lines[i], count=1)
            because(i, f"the script does not read {e.name}")
        if not t.env:
            continue
        names = {renames.get(e.name, e.name) for e in t.env}
        need = [n for n in script.always_required if n not in names and n != "GITSHA"]
        if not need:
            continue
        last = max(t.env, key=lambda e: e.line)
        i = last.line - 1
        pat = _PAIR.format(name=re.escape(renames.get(last.name, last.name)))
        m = re.search(pat, lines[i]) if i < len(lines) else None
        if m is None:
            refuse(last.line, f"the template lacks `-e {need[0]}` (the script requires it always) and its `-e` "
                              "lines cannot be located")
        add = " ".join(f'-e {n} "${n}"' for n in need)
        if re.fullmatch(rf"\s*{pat}\s*\\\s*", lines[i]):  # one pair per line: a new line like it
            indent = re.match(r"\s*", lines[i]).group(0)
            extra[i] = extra.get(i, "") + "".join(f'{indent}-e {n} "${n}" \\\n' for n in need)
        else:
            lines[i] = lines[i][:m.end()] + " " + add + lines[i][m.end():]
        because(i, "the script requires " + ", ".join(need) + " always; the service passes "
                + ("it" if len(need) == 1 else "them"))


def _runbook_rules(script, ops, reads, lines, drop, because, pin_table, protected) -> None:
    """A variable a code block sets that nothing reads; digests said to be pinned in the training launcher."""
    from domain.contract.ops import _blocks

    # Emptied lines stay as blank lines, so every block keeps the doc's own line numbers.
    view = "".join(line or "\n" for line in lines)
    for b in _blocks(view):
        if b.kind != "fence":
            continue
        for n, raw in enumerate(b.text.splitlines(), b.line):
            m = _ASSIGN.fullmatch(raw)
            if not m or m.group(1) in reads:
                continue
            name = m.group(1)
            others = "".join(line for j, line in enumerate(lines) if j != n - 1 and j not in drop)
            if re.search(rf"\$\{{?{re.escape(name)}\b", others):
                continue
            drop.add(n - 1)
            because(n - 1, f"nothing reads {name}: the script does not, and no command in this doc passes it")
    view = "".join(line if i not in drop else "\n" for i, line in enumerate(line or "\n" for line in lines))
    for first, last, content, launcher in launcher_sentences(view, protected):
        i = first - 1
        prefix = re.match(r"\s*(?:[-*+]\s+|\d+[.)]\s+)?", lines[i]).group(0)
        lines[i] = prefix + _rewrite_launcher_paragraph(content, launcher, pin_table) + "\n"
        reason = (f"the runbook forbids adding digests to the training launcher `{launcher}`; the digests go "
                  + (f"in the pin table `{pin_table}`" if pin_table else "in the PR body and the issue"))
        for j in range(first, last):
            lines[j] = ""
            because(j, f"joined into line {first}: {reason}")
        because(i, reason)


def _check_residual(script, ops, out, pin_table, protected, megatron_env=None) -> None:
    """Re-read the corrected doc: whatever the service would still report is refused, naming its line."""
    from domain.contract.launch import needs_bundle_launch
    from domain.contract.ops import parse_ops

    again = parse_ops(out, ops.path, uri_schemes=script.artifact_uri_schemes, arches=sorted(script.arches),
                      wheel_source_var=script.wheel_source_var, wheel_sources=script.wheel_sources,
                      megatron_var=script.megatron_var)
    left = find_disagreements(script, again, out)
    if megatron_env is not None:
        left += tag_form_disagreements(script, again, megatron_env)
    for t in again.templates.values():
        carrier = next((e.name for e in t.env if f"${e.name}" in " ".join(t.command)), None)
        if t.command and needs_bundle_launch(script, t.command, carrier):
            left.append(Disagreement(file=ops.path, field="launch command", prose_value=" ".join(t.command),
                                     prose_source=f"{ops.path}:{t.lines.get('command', t.line)}",
                                     script_value="run from the bundle", resolution="not corrected"))
    for first, _, _, launcher in launcher_sentences(out, protected):
        left.append(Disagreement(file=ops.path, field=f"digests pinned in {launcher}", prose_value="pinned there",
                                 prose_source=f"{ops.path}:{first}", script_value="forbidden by the runbook",
                                 resolution="not corrected"))
    if left:
        d = left[0]
        line = int(d.prose_source.rsplit(":", 1)[1]) if d.prose_source else 0
        raise UncorrectableProse(ops.path, line, "an ops doc the service can correct",
                                 f"{d.field} stays stale after correction ({d.prose_value!r} against "
                                 f"{d.script_value!r}); correct it by hand")


def corrected_ops_text(script: ScriptContract, ops: OpsContract, text: str) -> str | None:
    """The ops doc corrected to match the script, or None if nothing changes."""
    return correct_ops(script, ops, text).text


def _bundle_launch(script: ScriptContract, ops: OpsContract, lines: list[str]) -> list[int]:
    """Rewrite a stale launch command (a decoded copy of a script that needs its siblings) in place;
    returns the indexes of the lines changed."""
    from domain.contract.launch import bundle_command, needs_bundle_launch

    changed: list[int] = []
    for t in ops.templates.values():
        if not t.command:
            continue
        carrier = next((e.name for e in t.env if f"${e.name}" in " ".join(t.command)), None)
        if not needs_bundle_launch(script, t.command, carrier):
            continue
        old, new = t.command[-1], bundle_command(script.path)[-1]
        i = t.lines.get("command", t.line) - 1
        for j in [i, *range(len(lines))]:
            if 0 <= j < len(lines) and old in lines[j]:
                lines[j] = lines[j].replace(old, new, 1)
                changed.append(j)
                break
        for e in t.env:  # the `-e BUILD_B64 "$BUILD_B64" \` line: nothing reads it any more
            j = e.line - 1
            if e.name == carrier and 0 <= j < len(lines) and re.fullmatch(
                    rf'\s*-e\s+{re.escape(e.name)}\s+"?\$\{{?{re.escape(e.name)}\}}?"?\s*\\?\s*', lines[j]):
                lines[j] = ""
                changed.append(j)
    return changed


def tag_form_disagreements(script: ScriptContract, ops: OpsContract, megatron_env: list[EnvPair]) -> list[Disagreement]:
    """Tag forms a placements table states (`gpu-rl-<sha>-arm64`) against the script's tag derivation."""
    from domain.contract.script import render, shell_values

    out: list[Disagreement] = []
    for arch, p in ops.placements.items():
        if not p.tag_forms or arch not in script.arches:
            continue
        expected: set[str] = set()
        for env in ({}, {e.name: e.value for e in megatron_env}):
            try:
                expected.add(render(script.tag_pattern, shell_values(script, arch, env, "<sha>")))
            except KeyError:
                return out  # the script's tag needs a value only the job has: nothing to compare
        stated = {re.sub(r"<[^>]+>|\$\{?GITSHA\}?", "<sha>", f) for f in p.tag_forms}
        if stated != expected:
            out.append(Disagreement(
                file=ops.path, field=f"tag forms: {arch}", prose_value=", ".join(sorted(stated)),
                prose_source=f"{ops.path}:{p.line}", script_value=", ".join(sorted(expected)),
                other_source=f"{script.path}:{script.lines.get('tag_pattern', 0)}",
                resolution="script wins: the plan tags images as the script derives them"))
    return out
