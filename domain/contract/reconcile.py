"""Where the ops doc disagrees with the script (the script wins), and the corrected ops text.

Why: the runbook says prose outranked by the script must be corrected in the same change, so the
service reports each disagreement and can propose the corrected table for the build PR.
"""

from __future__ import annotations

from domain.contract.models import Disagreement, OpsContract, ScriptContract


def find_disagreements(script: ScriptContract, ops: OpsContract) -> list[Disagreement]:
    out: list[Disagreement] = []
    by_name = {r.name: r for r in script.required}
    rows = {r.variable: r for r in ops.contract_rows}
    for row in ops.contract_rows:
        req = by_name.get(row.variable)
        field = f"build contract: {row.variable}"
        if row.always or row.when:
            prose = "required " + ("always" if row.always else " and ".join(str(c) for c in row.when))
            if req is None:
                out.append(Disagreement(
                    file=ops.path, field=field, prose_value=prose,
                    script_value="not required by the script",
                    resolution=f"script wins: drop the {row.variable} row from the build-contract table"))
            elif sorted(map(str, req.when)) != sorted(map(str, row.when)):
                script_when = "always" if req.always else " and ".join(map(str, req.when))
                out.append(Disagreement(
                    file=ops.path, field=field, prose_value=prose, script_value=f"required {script_when}",
                    resolution=f"script wins: set 'required when' of {row.variable} to {script_when}"))
        elif row.optional_default is not None:
            knob = script.knobs.get(row.variable)
            if knob is None:
                if req is not None:
                    out.append(Disagreement(
                        file=ops.path, field=field, prose_value="optional", script_value="required",
                        resolution=f"script wins: mark {row.variable} required"))
                continue
            if row.optional_default and not knob.default.startswith("$") and row.optional_default != knob.default:
                out.append(Disagreement(
                    file=ops.path, field=field, prose_value=f"default {row.optional_default}",
                    script_value=f"default {knob.default}",
                    resolution=f"script wins: set the default of {row.variable} to {knob.default}"))
    for req in script.required:
        if req.name not in rows:
            when = "always" if req.always else " and ".join(map(str, req.when))
            out.append(Disagreement(
                file=ops.path, field=f"build contract: {req.name}", prose_value="absent",
                script_value=f"required {when}",
                resolution=f"script wins: add a {req.name} row (required {when})"))
    for arch, p in ops.placements.items():
        if arch not in script.arches:
            out.append(Disagreement(
                file=ops.path, field=f"placement: {arch}", prose_value=f"{arch} on {p.cluster}",
                script_value=f"the script builds only {', '.join(sorted(script.arches))}",
                resolution=f"script wins: no {arch} build until the script supports it"))
    for arch, t in ops.templates.items():
        names = {e.name for e in t.env}
        for name in script.always_required:
            if name not in names:
                out.append(Disagreement(
                    file=ops.path, field=f"launch template {arch}: -e {name}", prose_value="absent",
                    script_value="required always",
                    resolution=f'script wins: add `-e {name} "${name}"` to the {arch} template'))
    return out


def corrected_ops_text(script: ScriptContract, ops: OpsContract, text: str) -> str | None:
    """The ops doc with its build-contract table fixed to match the script, or None if nothing changes."""
    lines = text.splitlines(keepends=True)
    by_name = {r.name: r for r in script.required}
    changed = False
    drop: set[int] = set()
    for row in ops.contract_rows:
        i = row.line - 1
        req = by_name.get(row.variable)
        if (row.always or row.when) and req is None:
            drop.add(i)
            changed = True
        elif (row.always or row.when) and req is not None:
            want = "always" if req.always else " and ".join(map(str, req.when))
            if sorted(map(str, req.when)) != sorted(map(str, row.when)):
                lines[i] = lines[i].replace(f"| {row.required_when} |", f"| {want} |", 1)
                changed = True
        elif row.optional_default:
            knob = script.knobs.get(row.variable)
            if knob and not knob.default.startswith("$") and knob.default != row.optional_default:
                lines[i] = lines[i].replace(f"(default: {row.optional_default})", f"(default: {knob.default})", 1)
                changed = True
    present = {r.variable for r in ops.contract_rows}
    missing = [r for r in script.required if r.name not in present]
    if missing and ops.contract_rows:
        last = max(r.line for r in ops.contract_rows) - 1
        extra = "".join(
            f"| `{r.name}` | {'always' if r.always else ' and '.join(map(str, r.when))} | "
            f"required by `{script.path}` |\n" for r in missing)
        lines[last] = lines[last] + extra
        changed = True
    if not changed:
        return None
    return "".join(line for i, line in enumerate(lines) if i not in drop)
