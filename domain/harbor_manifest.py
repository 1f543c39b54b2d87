"""Harbor dependency manifest: parse ``pyproject.toml`` and diff two pins.

Why: the image installs ``harbor[<extras>] @ git+...@HARBOR_COMMIT`` after the frozen lock, so
Harbor's own requirements override the lock. Moving the pin can silently add, drop or re-pin packages
in the image (at ``74d76ecb`` ``datasets`` moved into an extra). Before repinning, the service diffs
the base dependencies plus the extras the Dockerfile installs between the old and the new commit.

Pure: strings in, pydantic models out. ``packaging`` is not assumed to be installed, so requirement
names are parsed here (PEP 508 name at the start of the string, normalised per PEP 503).
"""

from __future__ import annotations

import re
import tomllib

from pydantic import BaseModel, ConfigDict, Field

BASE = "dependencies"

_NAME_RE = re.compile(r"^\s*([A-Za-z0-9](?:[A-Za-z0-9._-]*[A-Za-z0-9])?)")
_DOCKERFILE_HARBOR_RE = re.compile(r"\bharbor\s*\[([^\]]*)\]\s*@\s*git\+", re.IGNORECASE)


class ManifestError(ValueError):
    """The pyproject text is not a usable PEP 621 manifest."""


class _Model(BaseModel):
    model_config = ConfigDict(frozen=True)


def normalize_name(name: str) -> str:
    """PEP 503 normalisation: ``Foo_Bar.baz`` -> ``foo-bar-baz``."""
    return re.sub(r"[-_.]+", "-", name).lower()


def parse_requirement(requirement: str) -> tuple[str, str]:
    """Split a PEP 508 string into (normalised name, the rest with whitespace collapsed).

    The rest keeps extras, version specifiers, URLs and markers verbatim, so any textual change of
    a requirement shows up as a changed spec.
    """
    match = _NAME_RE.match(requirement)
    if not match:
        raise ManifestError(f"cannot read a package name from requirement {requirement!r}")
    rest = requirement[match.end() :]
    spec = " ".join(rest.split())
    return normalize_name(match.group(1)), spec


def location_for_extra(extra: str) -> str:
    return f"extra:{extra}"


class HarborManifest(_Model):
    """Requirements keyed by normalised name: base ``dependencies`` and each extra."""

    name: str | None = None
    dependencies: dict[str, str] = Field(default_factory=dict)
    extras: dict[str, dict[str, str]] = Field(default_factory=dict)

    def locations(self) -> dict[str, dict[str, str]]:
        """name -> {location: spec}; location is ``dependencies`` or ``extra:<x>``."""
        out: dict[str, dict[str, str]] = {}
        for name, spec in self.dependencies.items():
            out.setdefault(name, {})[BASE] = spec
        for extra, reqs in self.extras.items():
            for name, spec in reqs.items():
                out.setdefault(name, {})[location_for_extra(extra)] = spec
        return out

    def image_requirements(self, installed_extras: list[str]) -> dict[str, tuple[str, ...]]:
        """What an install of ``harbor[<installed_extras>]`` asks for: name -> sorted specs.

        Self-references (``all = ["harbor[analysis]"]``) are expanded.
        """
        wanted = self._expand_extras([normalize_name(e) for e in installed_extras])
        specs: dict[str, set[str]] = {}
        for name, spec in self.dependencies.items():
            specs.setdefault(name, set()).add(spec)
        for extra in wanted:
            for name, spec in self.extras.get(extra, {}).items():
                if self.name and name == self.name:
                    continue
                specs.setdefault(name, set()).add(spec)
        return {name: tuple(sorted(s)) for name, s in sorted(specs.items())}

    def _expand_extras(self, extras: list[str]) -> list[str]:
        seen: list[str] = []
        todo = list(extras)
        while todo:
            extra = todo.pop()
            if extra in seen:
                continue
            seen.append(extra)
            self_ref = self.extras.get(extra, {}).get(self.name or "")
            if self_ref:
                inner = re.match(r"\s*\[([^\]]*)\]", self_ref)
                if inner:
                    todo.extend(normalize_name(e) for e in inner.group(1).split(",") if e.strip())
        return sorted(seen)


def parse_harbor_manifest(pyproject_text: str) -> HarborManifest:
    """Read ``[project] dependencies`` and ``[project.optional-dependencies]`` from pyproject text."""
    try:
        data = tomllib.loads(pyproject_text)
    except tomllib.TOMLDecodeError as exc:
        raise ManifestError(f"pyproject.toml is not valid TOML: {exc}") from exc
    project = data.get("project")
    if not isinstance(project, dict):
        raise ManifestError("pyproject.toml has no [project] table")
    if "dependencies" in project.get("dynamic", []):
        raise ManifestError("pyproject.toml declares dependencies as dynamic; cannot diff them statically")

    def _reqs(items: object, where: str) -> dict[str, str]:
        if not isinstance(items, list) or not all(isinstance(i, str) for i in items):
            raise ManifestError(f"{where} must be a list of strings")
        out: dict[str, str] = {}
        for item in items:
            name, spec = parse_requirement(item)
            # The same name twice (e.g. split by markers) is kept as one combined spec.
            out[name] = f"{out[name]} || {spec}" if name in out else spec
        return out

    extras_raw = project.get("optional-dependencies", {})
    if not isinstance(extras_raw, dict):
        raise ManifestError("[project.optional-dependencies] must be a table")
    raw_name = project.get("name")
    return HarborManifest(
        name=normalize_name(raw_name) if isinstance(raw_name, str) else None,
        dependencies=_reqs(project.get("dependencies", []), "[project] dependencies"),
        extras={
            normalize_name(extra): _reqs(items, f"optional-dependencies.{extra}")
            for extra, items in extras_raw.items()
        },
    )


def extras_installed_by_dockerfile(dockerfile_text: str) -> list[str]:
    """Extras named in ``harbor[a,b,c] @ git+...`` install lines (union over all such lines)."""
    extras: set[str] = set()
    for match in _DOCKERFILE_HARBOR_RE.finditer(dockerfile_text):
        extras.update(normalize_name(e.strip()) for e in match.group(1).split(",") if e.strip())
    return sorted(extras)


class Requirement(_Model):
    name: str
    location: str
    spec: str
    in_image: bool


class SpecChange(_Model):
    name: str
    location: str
    old_spec: str
    new_spec: str
    in_image: bool


class Move(_Model):
    name: str
    from_location: str
    to_location: str
    old_spec: str
    new_spec: str
    in_image: bool  # either side is installed into the image


class HarborDiff(_Model):
    added: list[Requirement] = Field(default_factory=list)
    removed: list[Requirement] = Field(default_factory=list)
    changed: list[SpecChange] = Field(default_factory=list)
    moved: list[Move] = Field(default_factory=list)
    extras_changed: list[str] = Field(default_factory=list)
    installed_extras: list[str] = Field(default_factory=list)
    affects_image: bool = False
    image_changes: list[str] = Field(default_factory=list)
    summary_lines: list[str] = Field(default_factory=list)

    @property
    def empty(self) -> bool:
        return not (self.added or self.removed or self.changed or self.moved or self.extras_changed)


def _installed(location: str, installed: set[str]) -> bool:
    return location == BASE or location.removeprefix("extra:") in installed


def diff_manifests(old: HarborManifest, new: HarborManifest, installed_extras: list[str]) -> HarborDiff:
    """Diff two Harbor manifests; only base deps and ``installed_extras`` decide ``affects_image``."""
    installed = {normalize_name(e) for e in installed_extras}
    old_locs, new_locs = old.locations(), new.locations()
    added: list[Requirement] = []
    removed: list[Requirement] = []
    changed: list[SpecChange] = []
    moved: list[Move] = []

    for name in sorted(set(old_locs) | set(new_locs)):
        before, after = old_locs.get(name, {}), new_locs.get(name, {})
        for loc in sorted(set(before) & set(after)):
            if before[loc] != after[loc]:
                changed.append(
                    SpecChange(name=name, location=loc, old_spec=before[loc], new_spec=after[loc],
                               in_image=_installed(loc, installed))
                )
        gone = sorted(set(before) - set(after))
        came = sorted(set(after) - set(before))
        # Pair a lost location with a gained one as a move; the leftovers are plain adds/removes.
        while gone and came:
            src, dst = gone.pop(0), came.pop(0)
            moved.append(
                Move(name=name, from_location=src, to_location=dst, old_spec=before[src],
                     new_spec=after[dst], in_image=_installed(src, installed) or _installed(dst, installed))
            )
        removed += [Requirement(name=name, location=loc, spec=before[loc],
                                in_image=_installed(loc, installed)) for loc in gone]
        added += [Requirement(name=name, location=loc, spec=after[loc],
                              in_image=_installed(loc, installed)) for loc in came]

    extras_changed = sorted(
        extra for extra in set(old.extras) | set(new.extras) if old.extras.get(extra) != new.extras.get(extra)
    )
    old_image = old.image_requirements(sorted(installed))
    new_image = new.image_requirements(sorted(installed))
    image_changes = _image_changes(old_image, new_image)
    diff = HarborDiff(
        added=added, removed=removed, changed=changed, moved=moved, extras_changed=extras_changed,
        installed_extras=sorted(installed), affects_image=bool(image_changes), image_changes=image_changes,
    )
    return diff.model_copy(update={"summary_lines": _summary(diff)})


def _image_changes(old: dict[str, tuple[str, ...]], new: dict[str, tuple[str, ...]]) -> list[str]:
    lines = []
    for name in sorted(set(old) | set(new)):
        if name not in new:
            lines.append(f"image loses {name} {' | '.join(old[name])}".rstrip())
        elif name not in old:
            lines.append(f"image gains {name} {' | '.join(new[name])}".rstrip())
        elif old[name] != new[name]:
            lines.append(f"image re-pins {name}: {' | '.join(old[name]) or '(any)'} -> "
                         f"{' | '.join(new[name]) or '(any)'}")
    return lines


def _summary(diff: HarborDiff) -> list[str]:
    def mark(in_image: bool) -> str:
        return "" if in_image else " [not installed in image]"

    lines = [f"installed extras: {', '.join(diff.installed_extras) or '(none)'}"]
    lines += [f"added {r.name} {r.spec} to {r.location}{mark(r.in_image)}".replace("  ", " ") for r in diff.added]
    lines += [f"removed {r.name} {r.spec} from {r.location}{mark(r.in_image)}".replace("  ", " ")
              for r in diff.removed]
    lines += [f"changed {c.name} in {c.location}: {c.old_spec or '(any)'} -> {c.new_spec or '(any)'}"
              f"{mark(c.in_image)}" for c in diff.changed]
    lines += [f"moved {m.name} from {m.from_location} to {m.to_location}"
              + (f" ({m.old_spec or '(any)'} -> {m.new_spec or '(any)'})" if m.old_spec != m.new_spec else "")
              + mark(m.in_image) for m in diff.moved]
    if diff.extras_changed:
        lines.append(f"extras changed: {', '.join(diff.extras_changed)}")
    lines.append("affects image: " + ("yes" if diff.affects_image else "no"))
    lines += [f"  {line}" for line in diff.image_changes]
    return lines
