"""The configuration reference (docs/configuration.md), generated from the pydantic models of
``domain/config.py``, and the key check between those models and ``deploy/config.example.toml``.

Why generated: keys are added often; a hand-written list goes stale the day one lands. Every key's
type, default and description come from the model (``Field(description=...)``), so a new key shows up
here by itself (``scripts/gen-docs`` rewrites the file; tests/docs/test_reference_docs.py compares).
Pure: reads models and TOML text, writes nothing.
"""

from __future__ import annotations

import json
import tomllib
import types
import typing
from dataclasses import dataclass
from typing import Any, Literal

from pydantic import BaseModel
from pydantic.fields import FieldInfo
from pydantic_core import PydanticUndefined

from domain.config import CredentialSource, ServiceConfig

NAME = "<name>"  # a key the operator chooses (a cluster's name, an architecture)
ITEM = "[]"  # each entry of an array of tables


@dataclass(frozen=True)
class Key:
    path: str  # dotted, e.g. "clusters.<name>.port_forward.port"
    type: str
    default: str  # "" when required
    required: bool
    description: str


@dataclass(frozen=True)
class Section:
    path: str  # "" for the top level
    model: type[BaseModel]
    description: str
    required: bool
    keys: tuple[Key, ...]


def _unwrap(annotation: Any) -> tuple[Any, bool]:
    """(the annotation without ``None``, whether ``None`` was allowed)."""
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(annotation) if a is not type(None)]
        if len(args) < len(typing.get_args(annotation)):
            return (args[0] if len(args) == 1 else typing.Union[tuple(args)]), True  # noqa: UP007
    return annotation, False


def _is_model(t: Any) -> bool:
    return isinstance(t, type) and issubclass(t, BaseModel)


def _nested(annotation: Any) -> tuple[str, type[BaseModel]] | None:
    """How a field holds a section: ``("", M)`` a table, ``("<name>", M)`` a table of tables by name,
    ``("[]", M)`` an array of tables; None for a plain value (a credential source is a value)."""
    t, _ = _unwrap(annotation)
    if _is_model(t):
        return None if t is CredentialSource else ("", t)
    origin, args = typing.get_origin(t), typing.get_args(t)
    if origin is dict and len(args) == 2 and _is_model(args[1]) and args[1] is not CredentialSource:
        return NAME, args[1]
    if origin is list and args and _is_model(args[0]) and args[0] is not CredentialSource:
        return ITEM, args[0]
    return None


def _type_name(annotation: Any) -> str:
    t, _ = _unwrap(annotation)
    if t is CredentialSource:
        return "credential source"
    if typing.get_origin(t) is Literal:
        return " | ".join(json.dumps(a) for a in typing.get_args(t))
    if typing.get_origin(t) in (typing.Union, types.UnionType):
        return " | ".join(_type_name(a) for a in typing.get_args(t))
    origin, args = typing.get_origin(t), typing.get_args(t)
    names = {str: "string", int: "integer", float: "number", bool: "boolean"}
    if origin is list:
        return f"array of {_type_name(args[0])}"
    if origin is dict:
        return f"table of {_type_name(args[1])}"
    return names.get(t, getattr(t, "__name__", str(t)))


def _toml(value: Any) -> str:
    """A default as it would be written in the TOML file."""
    if isinstance(value, BaseModel):
        value = value.model_dump(exclude_defaults=True)
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return json.dumps(value, ensure_ascii=False)
    if isinstance(value, list):
        return "[" + ", ".join(_toml(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{ " + ", ".join(f"{k} = {_toml(v)}" for k, v in value.items()) + " }" if value else "{ }"
    return json.dumps(value)


def _default(field: FieldInfo) -> tuple[str, bool]:
    if field.default_factory is not None:
        value = field.default_factory()  # type: ignore[call-arg]
    elif field.default is PydanticUndefined:
        return "", True
    else:
        value = field.default
    if value is None:
        return "unset", False
    if isinstance(value, dict) and value and all(isinstance(v, BaseModel) for v in value.values()):
        return ", ".join(f"`{k}`" for k in value) + " (see below)", False
    if isinstance(value, list) and value and all(isinstance(v, BaseModel) for v in value):
        return f"{len(value)} entries (see deploy/config.example.toml)", False
    return f"`{_toml(value)}`", False


def sections(model: type[BaseModel] = ServiceConfig) -> list[Section]:
    """Every table of the configuration, in model order, with its keys (plain values only)."""
    out: list[Section] = []

    def walk(m: type[BaseModel], path: str, description: str, required: bool) -> None:
        keys, below = [], []
        for name, field in m.model_fields.items():
            sub = _nested(field.annotation)
            if sub is not None:
                kind, sub_model = sub
                child = f"{path}.{name}" if path else name
                below.append((sub_model, f"{child}.{kind}" if kind == NAME else child + kind,
                              field.description or "", _default(field)[1]))
                continue
            default, needed = _default(field)
            keys.append(Key(path=f"{path}.{name}" if path else name, type=_type_name(field.annotation),
                            default=default, required=needed, description=field.description or ""))
        out.append(Section(path, m, description, required, tuple(keys)))
        for sub_model, child, desc, needed in below:
            walk(sub_model, child, desc, needed)

    walk(model, "", (model.__doc__ or "").strip(), True)
    return out


def model_keys(model: type[BaseModel] = ServiceConfig) -> set[str]:
    """Every settable value's key path, e.g. ``clusters.<name>.kubectl``, ``build.deploy_boundary[].glob``."""
    return {k.path for s in sections(model) for k in s.keys}


def normalize(parts: list[str], model: type[BaseModel] = ServiceConfig) -> str | None:
    """A key path as written in a TOML file (``clusters.cw-rno2a.token.kind``) as the model names it
    (``clusters.<name>.token``); None when the model has no such key."""
    out, m, i = [], model, 0
    while i < len(parts):
        field = m.model_fields.get(parts[i])
        if field is None:
            return None
        out.append(parts[i])
        sub = _nested(field.annotation)
        if sub is None:
            return ".".join(out)  # a value (a credential source, a table of values) ends the path
        kind, m = sub
        i += 1
        if kind == NAME:
            if i == len(parts):
                return ".".join(out)
            out.append(NAME)
            i += 1
        elif kind == ITEM:
            out[-1] += ITEM
    return ".".join(out)


def _flatten(data: Any, prefix: list[str]) -> list[list[str]]:
    if isinstance(data, dict):
        if not data:
            return [prefix]
        return [p for k, v in data.items() for p in _flatten(v, [*prefix, k])]
    if isinstance(data, list) and data and all(isinstance(v, dict) for v in data):
        return [p for v in data for p in _flatten(v, prefix)]
    return [prefix]


def _header(line: str) -> list[str] | None:
    text = line.strip()
    if not text.startswith("["):
        return None
    try:
        table = tomllib.loads(text)
    except tomllib.TOMLDecodeError:
        return None
    path: list[str] = []
    while isinstance(table, dict) and len(table) == 1:
        key, table = next(iter(table.items()))
        path.append(key)
        if isinstance(table, list):
            table = table[0]
    return path


def example_keys(text: str, model: type[BaseModel] = ServiceConfig) -> tuple[set[str], set[str]]:
    """(the keys a TOML example sets or shows commented out, as the model names them; the keys it names
    that the model does not have). A commented line counts when it is TOML itself (``# token = {…}``
    or ``# [github.webhook]``); prose comments are skipped. Parsed by ``tomllib``, line by line for
    comments, so no TOML syntax is parsed by hand."""
    raw = _flatten(tomllib.loads(text), [])
    section: list[str] = []
    for line in text.splitlines():
        stripped = line.strip()
        header = _header(stripped)
        if header is not None:
            section = header
            continue
        if not stripped.startswith("#"):
            continue
        body = stripped.lstrip("#").strip()
        header = _header(body)
        if header is not None:
            section = header
            continue
        try:
            data = tomllib.loads(body)
        except tomllib.TOMLDecodeError:
            continue
        if data:
            raw += _flatten(data, list(section))
    known, unknown = set(), set()
    for parts in raw:
        key = normalize(parts, model)
        (known.add(key) if key else unknown.add(".".join(parts)))
    return known, unknown


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def configuration_markdown(model: type[BaseModel] = ServiceConfig) -> str:
    lines = [
        "# Configuration reference",
        "",
        "<!-- Generated by scripts/gen-docs from domain/config.py; do not edit by hand. -->",
        "",
        "One TOML file (`--config` or `$GPU_RL_BUILDER_CONFIG`) configures the worker, the starter and the "
        "sandbox. Unknown keys are refused, naming the file and the key. A Temporal client profile, "
        "`TEMPORAL_*` variables and the starter's flags override `[temporal]`. An annotated example: "
        "`deploy/config.example.toml`; production notes: `deploy/README.md`.",
        "",
        "`<name>` stands for a name you choose (a cluster, an architecture); `[]` marks an array of tables.",
    ]
    for s in sections(model):
        title = f"`[{s.path}]`" if s.path else "Top level"
        lines += ["", f"## {title}", ""]
        intro = " ".join(s.description.split())
        if s.path and s.required:
            intro = (intro + " **Required.**").strip()
        if intro:
            lines += [intro, ""]
        if not s.keys:
            continue
        lines += ["| Key | Type | Default | Description |", "|---|---|---|---|"]
        for k in s.keys:
            name = k.path.rsplit(".", 1)[-1] if s.path else k.path
            default = "**required**" if k.required else k.default
            lines.append(f"| `{name}` | {_cell(k.type)} | {_cell(default)} | {_cell(k.description)} |")
    lines += ["", "## Credential source", "",
              " ".join((CredentialSource.__doc__ or "").split()) + " Written as an inline table, e.g. "
              '`token = { kind = "file", path = "/var/run/secrets/gpu-rl-builder/ghcr-token" }`.', "",
              "| Key | Type | Default | Description |", "|---|---|---|---|"]
    for name, field in CredentialSource.model_fields.items():
        default, required = _default(field)
        lines.append(f"| `{name}` | {_cell(_type_name(field.annotation))} | "
                     f"{'**required**' if required else _cell(default)} | {_cell(field.description or '')} |")
    return "\n".join(lines) + "\n"


def undocumented(model: type[BaseModel] = ServiceConfig) -> list[str]:
    """Keys without a description (every key needs one: it is the reference's only text about it)."""
    missing = [k.path for s in sections(model) for k in s.keys if not k.description.strip()]
    missing += [f"credential source.{n}" for n, f in CredentialSource.model_fields.items() if not f.description]
    return missing
