"""Parse `.agents/ops/gpu-rl-image-build.md`: the runbook's tables and fenced launch templates.

Why: clusters, resources, priority, retries, the launch flags and the layer ceiling change between
ops-doc revisions; the service re-reads them at every build commit. Section and column names are the
contract with the doc's authors; anything else fails closed with the line number.
"""

from __future__ import annotations

import re
import shlex

from domain.contract.errors import ContractError
from domain.contract.models import (
    Condition,
    ContractRow,
    DeployRule,
    EnvPair,
    LaunchTemplate,
    LayerCeiling,
    OpsContract,
    Placement,
    WheelArtifact,
)

OPS_PATH = ".agents/ops/gpu-rl-image-build.md"

_UNITS = {"B": 1, "KB": 10**3, "MB": 10**6, "GB": 10**9, "TB": 10**12,
          "KIB": 2**10, "MIB": 2**20, "GIB": 2**30, "TIB": 2**40}
_VALUE_FLAGS = {"--task-image", "--job-name", "--cpu", "--memory", "--disk", "--gpu", "--tpu", "--priority",
                "--max-retries", "--timeout", "--user", "--region", "--zone", "--replicas", "--extra",
                "--reserve"}
_BOOL_FLAGS = {"--no-sync", "--enable-extra-resources", "--no-wait", "--preemptible", "--no-preemptible",
               "--terminate-on-exit", "--no-terminate-on-exit"}


class _Section:
    def __init__(self, level: int, title: str, line: int):
        self.level, self.title, self.line = level, title, line
        self.body: list[tuple[int, str]] = []


def _sections(text: str) -> list[_Section]:
    out: list[_Section] = [_Section(0, "", 0)]
    in_fence = False
    for i, line in enumerate(text.splitlines(), 1):
        if line.startswith("```"):
            in_fence = not in_fence
        m = None if in_fence else re.match(r"^(#{1,6})\s+(.*?)\s*$", line)
        if m:
            out.append(_Section(len(m.group(1)), m.group(2), i))
        else:
            out[-1].body.append((i, line))
    return out


def _find(sections: list[_Section], title: str, path: str, level: int | None = None) -> _Section:
    for s in sections:
        if s.title.lower() == title.lower() and (level is None or s.level == level):
            return s
    raise ContractError(path, 0, f"a section '{'#' * (level or 2)} {title}'")


def _table(section: _Section, path: str, columns: list[str]) -> list[tuple[int, dict[str, str]]]:
    rows = [(n, t) for n, t in section.body if t.strip().startswith("|")]
    if len(rows) < 2:
        raise ContractError(path, section.line, f"a table with columns {columns} under '{section.title}'")

    def cells(t: str) -> list[str]:
        return [c.strip() for c in t.strip().strip("|").split("|")]

    header_line, header = rows[0]
    got = [c.lower() for c in cells(header)]
    if got != [c.lower() for c in columns]:
        raise ContractError(path, header_line, f"table columns {columns}", " | ".join(cells(header)))
    if not re.fullmatch(r"[\s|:\-]+", rows[1][1]):
        raise ContractError(path, rows[1][0], "a |---| separator row")
    out = []
    for n, t in rows[2:]:
        c = cells(t)
        if len(c) != len(columns):
            raise ContractError(path, n, f"{len(columns)} cells", t.strip())
        out.append((n, dict(zip([x.lower() for x in columns], c, strict=True))))
    return out


def _code(cell: str) -> str:
    return cell.strip().strip("`").strip()


def parse_bytes(value: str, path: str = "", line: int = 0) -> int:
    """'8 GB' -> 8e9, '512GiB' -> 512*2**30 (decimal GB, binary GiB)."""
    m = re.fullmatch(r"\s*([0-9]+(?:\.[0-9]+)?)\s*([KMGT]i?B|B)\s*", value, re.I)
    if not m:
        raise ContractError(path, line, "a size like `8 GB`", value)
    return int(float(m.group(1)) * _UNITS[m.group(2).upper()])


def _yes_no(value: str, path: str, line: int) -> bool:
    v = value.strip().strip("*").lower()
    if v in ("yes", "true", "required"):
        return True
    if v in ("no", "false"):
        return False
    raise ContractError(path, line, "yes or no", value)


def _fence(section: _Section, path: str) -> tuple[int, list[tuple[int, str]]]:
    start = None
    body: list[tuple[int, str]] = []
    for n, t in section.body:
        if t.startswith("```"):
            if start is None:
                if t.strip() not in ("```bash", "```sh", "```shell"):
                    raise ContractError(path, n, "a ```bash fence", t.strip())
                start = n
                continue
            return start, body
        if start is not None:
            body.append((n, t))
    raise ContractError(path, section.line, f"a ```bash fenced block under '{section.title}'")


def _tokens(lines: list[tuple[int, str]], path: str) -> list[tuple[int, str]]:
    out: list[tuple[int, str]] = []
    for n, t in lines:
        t = t.rstrip()
        if t.endswith("\\"):
            t = t[:-1]
        if not t.strip() or t.strip().startswith("#"):
            continue
        try:
            out.extend((n, tok) for tok in shlex.split(t))
        except ValueError:
            raise ContractError(path, n, "one complete shell word list per line", t.strip()) from None
    return out


def _parse_template(arch: str, section: _Section, path: str) -> LaunchTemplate:
    start, body = _fence(section, path)
    toks = _tokens(body, path)
    if len(toks) < 3 or toks[0][1] != "iris":
        raise ContractError(path, start + 1, "`iris --cluster=<name> job run ...`")
    i = 1
    cluster = None
    n, t = toks[i]
    if t.startswith("--cluster="):
        cluster = t.split("=", 1)[1]
        i += 1
    elif t == "--cluster" and i + 1 < len(toks):
        cluster = toks[i + 1][1]
        i += 2
    else:
        raise ContractError(path, n, "`--cluster=<name>` after `iris`", t)
    if [x for _, x in toks[i:i + 2]] != ["job", "run"]:
        raise ContractError(path, toks[i][0], "`job run`", " ".join(x for _, x in toks[i:i + 2]))
    i += 2
    tpl = LaunchTemplate(arch=arch, cluster=cluster, line=start)
    while i < len(toks):
        n, t = toks[i]
        if t == "--":
            tpl.command = [x for _, x in toks[i + 1:]]
            break
        if t == "-e":
            if i + 2 >= len(toks):
                raise ContractError(path, n, "`-e NAME VALUE` (two arguments)")
            name, value = toks[i + 1][1], toks[i + 2][1]
            if "=" in name or not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", name):
                raise ContractError(path, n, "`-e NAME VALUE` (the CLI rejects KEY=VALUE)", name)
            tpl.env.append(EnvPair(name=name, value=value))
            i += 3
            continue
        flag, eq, inline = t.partition("=")
        if flag in _BOOL_FLAGS and not eq:
            tpl.flags[flag] = True
            i += 1
            continue
        if flag in _VALUE_FLAGS:
            if eq:
                value = inline
                i += 1
            elif i + 1 < len(toks):
                value = toks[i + 1][1]
                i += 2
            else:
                raise ContractError(path, n, f"a value after {flag}")
            tpl.flags[flag] = value
            continue
        raise ContractError(path, n, "a known `iris job run` flag", t)
    if not tpl.command:
        raise ContractError(path, start, "a command after `--`")
    f = tpl.flags
    try:
        tpl.task_image = f.get("--task-image")  # type: ignore[assignment]
        tpl.no_sync = bool(f.get("--no-sync", False))
        tpl.enable_extra_resources = bool(f.get("--enable-extra-resources", False))
        tpl.no_wait = bool(f.get("--no-wait", False))
        tpl.job_name = f.get("--job-name")  # type: ignore[assignment]
        tpl.cpu = float(f["--cpu"]) if "--cpu" in f else None  # type: ignore[arg-type]
        tpl.memory = f.get("--memory")  # type: ignore[assignment]
        tpl.disk = f.get("--disk")  # type: ignore[assignment]
        tpl.gpu = f.get("--gpu")  # type: ignore[assignment]
        tpl.priority = f.get("--priority")  # type: ignore[assignment]
        tpl.max_retries = int(f["--max-retries"]) if "--max-retries" in f else None  # type: ignore[arg-type]
        tpl.timeout_s = int(f["--timeout"]) if "--timeout" in f else None  # type: ignore[arg-type]
    except ValueError as e:
        raise ContractError(path, start, "numeric --cpu, --max-retries and --timeout", str(e)) from None
    if "--preemptible" in f:
        tpl.preemptible = True
    if "--no-preemptible" in f:
        tpl.preemptible = False
    return tpl


def _parse_contract_rows(section: _Section, path: str) -> list[ContractRow]:
    rows = []
    for n, r in _table(section, path, ["variable", "required when", "source"]):
        var = _code(r["variable"])
        when = r["required when"].strip()
        row = ContractRow(variable=var, required_when=when, source=r["source"], line=n)
        low = when.lower()
        if low == "always":
            row.always = True
        elif m := re.fullmatch(r"`?([A-Z_][A-Z0-9_]*)\s*(=|!=)\s*([^`\s]+)`?", when):
            row.when = [Condition(var=m.group(1), op=m.group(2), value=m.group(3))]  # type: ignore[arg-type]
        elif m := re.fullmatch(r"optional(?:\s*\(default:\s*(.*?)\))?", when, re.I):
            row.optional_default = (m.group(1) or "").strip().strip("`")
        else:
            raise ContractError(path, n, "'always', 'VAR=value' or 'optional (default: X)'", when)
        rows.append(row)
    return rows


def _parse_artifact(section: _Section, path: str, schemes: list[str] | None) -> WheelArtifact:
    fields = {r["field"].lower(): (n, _code(r["value"])) for n, r in _table(section, path, ["field", "value"])}
    for key in ("uri", "sha256", "usable"):
        if key not in fields:
            raise ContractError(path, section.line, f"a '{key}' row in the wheel artifact table")
    line, uri = fields["uri"]
    sha = fields["sha256"][1]
    stated = _yes_no(fields["usable"][1], path, fields["usable"][0])
    reasons = []
    if not stated:
        reasons.append("the ops doc marks it not usable")
    if not re.fullmatch(r"[0-9a-f]{64}", sha):
        reasons.append("its SHA-256 is not a full 64-hex value")
    if not uri or (schemes and not any(uri.startswith(s) for s in schemes)):
        reasons.append("its URI scheme is not one the script accepts")
    return WheelArtifact(
        uri=uri or None, sha256=sha or None,
        manifest_platform=fields.get("manifest platform", (0, ""))[1] or None,
        stated_usable=stated, usable=not reasons, reason="; ".join(reasons) or "usable", line=line,
    )


def parse_ops(text: str, path: str = OPS_PATH, *, uri_schemes: list[str] | None = None) -> OpsContract:
    sections = _sections(text)
    boundary = [
        DeployRule(glob=_code(r["edited path"]), rebuild=_yes_no(r["image rebuild"], path, n),
                   reaches=r["reaches the cluster how"], line=n)
        for n, r in _table(_find(sections, "Deploy boundary", path), path,
                           ["edited path", "image rebuild", "reaches the cluster how"])
    ]
    rows = _parse_contract_rows(_find(sections, "Build contract", path), path)
    placements: dict[str, Placement] = {}
    for n, r in _table(_find(sections, "Cluster placements", path), path, ["architecture", "cluster", "priority"]):
        arch = _code(r["architecture"])
        placements[arch] = Placement(arch=arch, cluster=_code(r["cluster"]),
                                     priority=_code(r["priority"]) or None, line=n)
    launch = _find(sections, "Launch templates", path, level=2)
    idx = sections.index(launch)
    templates: dict[str, LaunchTemplate] = {}
    megatron_env: list[EnvPair] | None = None
    for s in sections[idx + 1:]:
        if s.level <= launch.level:
            break
        if s.title.lower() == "megatron add-on":
            start, body = _fence(s, path)
            toks = [t for _, t in _tokens(body, path)]
            if len(toks) % 3 or any(toks[k] != "-e" for k in range(0, len(toks), 3)):
                raise ContractError(path, start + 1, "only `-e NAME VALUE` pairs in the Megatron add-on")
            megatron_env = [EnvPair(name=toks[k + 1], value=toks[k + 2]) for k in range(0, len(toks), 3)]
        else:
            arch = s.title.strip().strip("`")
            templates[arch] = _parse_template(arch, s, path)
    if not templates:
        raise ContractError(path, launch.line, "'### <arch>' launch template subsections")
    if megatron_env is None:
        raise ContractError(path, launch.line, "a '### Megatron add-on' subsection")
    for arch, p in placements.items():
        if arch not in templates:
            raise ContractError(path, p.line, f"a '### {arch}' launch template for the placement")
    ceiling_rows = {r["check"].lower(): (n, r["value"]) for n, r in
                    _table(_find(sections, "Layer ceiling", path), path, ["check", "value"])}
    values: dict[str, int] = {}
    for key, (n, v) in ceiling_rows.items():
        if key.startswith("max"):
            values["max_layer_bytes"] = parse_bytes(v, path, n)
        elif key.startswith(("flag", "warn")):
            values["warn_layer_bytes"] = parse_bytes(v, path, n)
        elif key.startswith("min"):
            if not v.strip().isdigit():
                raise ContractError(path, n, "a whole number of layers", v)
            values["min_layers"] = int(v)
        else:
            raise ContractError(path, n, "a 'max ...', 'flag ...' or 'min layer count' row", key)
    for k in ("max_layer_bytes", "warn_layer_bytes", "min_layers"):
        if k not in values:
            raise ContractError(path, 0, f"a layer ceiling row for {k}")
    try:
        art_section = _find(sections, "Prebuilt wheel artifact", path)
        artifact = _parse_artifact(art_section, path, uri_schemes)
    except ContractError as e:
        if e.line == 0 and "section" in e.expected:
            artifact = None
        else:
            raise
    return OpsContract(path=path, deploy_boundary=boundary, contract_rows=rows, placements=placements,
                       templates=templates, megatron_env=megatron_env, layer_ceiling=LayerCeiling(**values),
                       wheel_artifact=artifact)
