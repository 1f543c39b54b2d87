"""The rebuild boundary: does a change between two commits reach the image?

Decided from the ops file's deploy-boundary table, then the configured rules (``build.deploy_boundary``)
for paths the table does not name or when the doc has no table (first matching row wins, as an operator reads it)
plus what the Dockerfiles actually COPY (the Dockerfile outranks prose: a path it copies that no row
names still reaches the image), plus a Harbor move. Pure; the activity supplies the inputs.
"""

from __future__ import annotations

import fnmatch
import re

from pydantic import BaseModel


class BoundaryRule(BaseModel):
    glob: str
    rebuild: bool
    reaches: str = ""
    source: str = ""  # "file:line" of the ops doc row, or "config:build.deploy_boundary[i]"


class BoundaryVerdict(BaseModel):
    needed: bool
    reasons: list[str]
    deciding: list[str] = []  # the reasons that crossed the boundary (a subset of ``reasons``, same order)


def copy_sources(dockerfile_text: str) -> list[str]:
    """Context paths a Dockerfile COPYs/ADDs (``--from=`` copies come from stages, not the context)."""
    text = re.sub(r"\\\n", " ", dockerfile_text)
    out: list[str] = []
    for line in text.splitlines():
        m = re.match(r"\s*(COPY|ADD)\s+(.*)", line, re.I)
        if not m:
            continue
        parts = [p for p in m.group(2).split() if not p.startswith("--")]
        if any(p.startswith("--from") for p in m.group(2).split()):
            continue
        out.extend(p.rstrip("/") for p in parts[:-1])  # the last word is the destination
    return out


def _glob_match(glob: str, path: str) -> bool:
    pattern = glob.replace("**", "*")
    if fnmatch.fnmatchcase(path, pattern):
        return True
    return glob.endswith("/**") and path == glob[:-3]


def _copied(path: str, sources: list[str]) -> str | None:
    for src in sources:
        if src in (".", "./") or path == src or path.startswith(src + "/") or fnmatch.fnmatchcase(path, src):
            return src
    return None


def decide(rules: list[BoundaryRule], dockerfile_texts: dict[str, str], changed_paths: list[str], *,
           harbor_moved: bool, old_harbor: str | None = None, new_harbor: str | None = None) -> BoundaryVerdict:
    reasons: list[str] = []
    deciding: list[str] = []

    def crosses(reason: str) -> None:
        reasons.append(reason)
        deciding.append(reason)

    if harbor_moved:
        crosses(f"Harbor moved {(old_harbor or '?')[:12]} → {(new_harbor or '?')[:12]} (HARBOR_COMMIT is baked)")
    sources = sorted({s for text in dockerfile_texts.values() for s in copy_sources(text)})
    for path in changed_paths:
        if path in dockerfile_texts:
            crosses(f"{path}: a Dockerfile changed (pins, base or installs)")
            continue
        rule = next((r for r in rules if _glob_match(r.glob, path)), None)
        if rule is not None:
            at = f" ({rule.source})" if rule.source else ""
            if rule.rebuild:
                crosses(f"{path}: matches `{rule.glob}`{at} → image rebuild required")
            else:
                reasons.append(f"{path}: matches `{rule.glob}`{at} → {rule.reaches or 'no rebuild'}")
            continue
        src = _copied(path, sources)
        if src is not None:
            crosses(f"{path}: no deploy-boundary row, but the Dockerfile COPYs `{src}` → rebuild")
        else:
            reasons.append(f"{path}: outside the image (no row, not copied)")
    if not changed_paths and not harbor_moved:
        reasons.append("no change since the last validated image")
    return BoundaryVerdict(needed=bool(deciding), reasons=reasons, deciding=deciding)
