"""Where the ops doc disagrees with the script (the script wins), and the corrected ops text.

Why: the runbook says prose outranked by the script must be corrected in the same change, so the
service reports each disagreement and proposes the corrected doc for the build commit. The most
common real drift is a renamed credential (era C's doc still says ``DOCKER_USER_ID``/``GHCR_TOKEN``
where the script reads ``REGISTRY_USER``/``REGISTRY_TOKEN``): it is corrected by renaming the word
throughout the doc, so table rows, ``-e`` pairs and the commands that set them stay consistent.
"""

from __future__ import annotations

import re

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


def corrected_ops_text(script: ScriptContract, ops: OpsContract, text: str) -> str | None:
    """The ops doc corrected to match the script, or None if nothing changes."""
    if not ops.found or not text:
        return None
    renames = credential_renames(script, ops, text)
    fixed = text
    for old, new in renames.items():
        fixed = re.sub(rf"\b{re.escape(old)}\b", new, fixed)
    lines = fixed.splitlines(keepends=True)
    reqs = _requirements(script)
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
                continue
            keep.add(i)
            if not _row_agrees(row, req[0]) and f"| {row.required_when} |" in lines[i]:
                lines[i] = lines[i].replace(f"| {row.required_when} |", f"| {req[0]} |", 1)
        else:
            keep.add(i)
            knob = script.knobs.get(name)
            if row.optional_default and knob and not knob.default.startswith("$") and \
                    knob.default != row.optional_default:
                lines[i] = lines[i].replace(f"(default: {row.optional_default})", f"(default: {knob.default})", 1)
    drop -= keep  # a line naming several variables stays while one of them is still right
    present = {renames.get(r.variable, r.variable) for r in ops.contract_rows}
    missing = {name: when for name, (when, _) in _requirements(script).items() if name not in present}
    extra: dict[int, str] = {}
    if missing and ops.contract_rows:
        last = max(r.line for r in ops.contract_rows) - 1
        n = _cells(lines[last])
        extra[last] = "".join(_row_line(n, name, when, script.path) for name, when in missing.items())
    _bundle_launch(script, ops, lines)
    out = "".join((line if i not in drop else "") + extra.get(i, "") for i, line in enumerate(lines))
    return None if out == text else out


def _bundle_launch(script: ScriptContract, ops: OpsContract, lines: list[str]) -> None:
    """Rewrite a stale launch command (a decoded copy of a script that needs its siblings) in place."""
    from domain.contract.launch import bundle_command, needs_bundle_launch

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
                break
        for e in t.env:  # the `-e BUILD_B64 "$BUILD_B64" \` line: nothing reads it any more
            j = e.line - 1
            if e.name == carrier and 0 <= j < len(lines) and re.fullmatch(
                    rf'\s*-e\s+{re.escape(e.name)}\s+"?\$\{{?{re.escape(e.name)}\}}?"?\s*\\?\s*', lines[j]):
                lines[j] = ""


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
