"""Update the legacy image pin table (``cloud/iris/gpu_rl_images.py``) with validated digests.

Pure text surgery, failing closed: every entry to update must be found exactly once, keyed by
``(ImageArchitecture.X, ImageVariant.Y)``; nothing else in the file changes. Rebuilt entries get
literal provenance (source and Harbor commits), because other architectures may still point at an
older build; the module constants move only when every entry in the table shares the new commits.
"""

from __future__ import annotations

import re

from pydantic import BaseModel


class PinTableError(ValueError):
    pass


class PinEntry(BaseModel):
    architecture: str
    variant: str
    digest: str
    tag: str
    source_commit: str
    harbor_commit: str


_ENTRY = re.compile(
    r"(?P<head>\(ImageArchitecture\.(?P<arch>[A-Z0-9_]+),\s*ImageVariant\.(?P<variant>[A-Z0-9_]+)\)\s*:\s*"
    r"GpuRlImage\()(?P<body>.*?)(?P<tail>\n\s*\),)", re.S)
_FIELD = r"(?P<pre>\b{name}\s*=\s*)(?P<val>\"[^\"]*\"|[A-Za-z_][A-Za-z0-9_]*)"


def _set_field(body: str, name: str, value: str, path: str, key: str) -> str:
    pat = re.compile(_FIELD.format(name=name))
    if len(pat.findall(body)) != 1:
        raise PinTableError(f"{path}: entry {key} has no single `{name}=` field")
    return pat.sub(lambda m: f'{m.group("pre")}"{value}"', body, count=1)


def update_pin_table(text: str, entries: list[PinEntry], *, path: str = "cloud/iris/gpu_rl_images.py") -> str:
    if not re.search(r"\bGPU_RL_IMAGES\b", text):
        raise PinTableError(f"{path}: no GPU_RL_IMAGES table found")
    if not entries:
        raise PinTableError(f"{path}: nothing to pin")
    wanted = {(e.architecture.upper(), e.variant.upper()): e for e in entries}
    seen: set[tuple[str, str]] = set()
    all_keys: set[tuple[str, str]] = set()

    def repl(m: re.Match) -> str:
        key = (m.group("arch"), m.group("variant"))
        all_keys.add(key)
        e = wanted.get(key)
        if e is None:
            return m.group(0)
        if key in seen:
            raise PinTableError(f"{path}: entry {key} appears twice")
        seen.add(key)
        if not re.fullmatch(r"sha256:[0-9a-f]{64}", e.digest):
            raise PinTableError(f"{path}: refusing to pin non-digest {e.digest!r} for {key}")
        body = m.group("body")
        label = f"({key[0]}, {key[1]})"
        for name, value in (("digest", e.digest), ("tag", e.tag), ("source_commit", e.source_commit),
                            ("harbor_commit", e.harbor_commit)):
            body = _set_field(body, name, value, path, label)
        return m.group("head") + body + m.group("tail")

    out = _ENTRY.sub(repl, text)
    missing = sorted(set(wanted) - seen)
    if missing:
        raise PinTableError(f"{path}: no entry for {', '.join(f'({a}, {v})' for a, v in missing)}")
    if all_keys and all_keys <= seen and len({(e.source_commit, e.harbor_commit) for e in entries}) == 1:
        e = entries[0]
        for const, value in (("SOURCE_COMMIT", e.source_commit), ("HARBOR_COMMIT", e.harbor_commit)):
            out = re.sub(rf'^({const}\s*=\s*)"[^"]*"', lambda m, v=value: f'{m.group(1)}"{v}"', out, count=1,
                         flags=re.M)
    return out


def read_pins(text: str) -> dict[tuple[str, str], dict[str, str]]:
    """(ARCH, VARIANT) -> {digest, tag, source_commit, harbor_commit}, resolving module constants."""
    consts = dict(re.findall(r'^([A-Z_]+)\s*=\s*"([^"]*)"', text, flags=re.M))
    pins = {}
    for m in _ENTRY.finditer(text):
        fields = {}
        for name in ("digest", "tag", "source_commit", "harbor_commit"):
            f = re.search(_FIELD.format(name=name), m.group("body"))
            if f:
                v = f.group("val")
                fields[name] = v.strip('"') if v.startswith('"') else consts.get(v, v)
        pins[(m.group("arch"), m.group("variant"))] = fields
    return pins
