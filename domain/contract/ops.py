"""Read `.agents/ops/gpu-rl-image-build.md` by meaning: tables, `iris job run` code blocks, sentences.

Why markdown-it-py: the ops doc is prose that changes shape between revisions (a three-column
deploy-boundary table becomes two columns or a paragraph, full `iris job run` templates become one
resource line per architecture). A CommonMark parser gives tables with their header cells, fenced
blocks and paragraphs with source line numbers, so facts are found by what a header or a flag
*means*, never by a section title or a line layout. Nothing here refuses a build: a fact the prose
does not state (or states in a form not understood) is simply absent, recorded in ``skipped``, and
the configuration supplies it (``domain.contract.resolve``).
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass, field

from markdown_it import MarkdownIt

from domain.contract.errors import ContractError
from domain.contract.models import (
    Condition,
    ContractRow,
    DeployRule,
    EnvPair,
    LaunchTemplate,
    OpsContract,
    Placement,
    ProseCeiling,
    WheelArtifact,
)

OPS_PATH = ".agents/ops/gpu-rl-image-build.md"

_UNITS = {"B": 1, "KB": 10**3, "MB": 10**6, "GB": 10**9, "TB": 10**12,
          "KIB": 2**10, "MIB": 2**20, "GIB": 2**30, "TIB": 2**40}
_VALUE_FLAGS = {"--task-image", "--job-name", "--cpu", "--memory", "--disk", "--gpu", "--tpu", "--priority",
                "--max-retries", "--timeout", "--user", "--region", "--zone", "--replicas", "--extra",
                "--reserve", "--cluster"}
_BOOL_FLAGS = {"--no-sync", "--enable-extra-resources", "--no-wait", "--preemptible", "--no-preemptible",
               "--terminate-on-exit", "--no-terminate-on-exit"}
_FIELD_OF_FLAG = {"--task-image": "task_image", "--job-name": "job_name", "--cpu": "cpu", "--memory": "memory",
                  "--disk": "disk", "--gpu": "gpu", "--priority": "priority", "--max-retries": "max_retries",
                  "--timeout": "timeout_s", "--cluster": "cluster", "--no-sync": "no_sync",
                  "--enable-extra-resources": "enable_extra_resources", "--no-wait": "no_wait"}
_ARCH_WORDS = {"amd64": "amd64", "x86_64": "amd64", "arm64": "arm64", "aarch64": "arm64"}
_SIZE = re.compile(r"([0-9]+(?:\.[0-9]+)?)\s*([KMGT]i?B)\b", re.I)
_VAR = re.compile(r"^[A-Z_][A-Z0-9_]*$")


def parse_bytes(value: str, path: str = "", line: int = 0) -> int:
    """'8 GB' -> 8e9, '512GiB' -> 512*2**30 (decimal GB, binary GiB)."""
    m = re.fullmatch(r"\s*([0-9]+(?:\.[0-9]+)?)\s*([KMGT]i?B|B)\s*", value, re.I)
    if not m:
        raise ContractError(path, line, "a size like `8 GB`", value)
    return int(float(m.group(1)) * _UNITS[m.group(2).upper()])


# ----------------------------------------------------------------------------- Markdown blocks


@dataclass
class _Block:
    kind: str  # "table" | "fence" | "para"
    line: int  # 1-based first line
    headings: list[str]  # enclosing heading titles, outermost first
    text: str = ""  # para: inline source; fence: content
    info: str = ""  # fence info string
    header: list[str] = field(default_factory=list)  # table
    rows: list[tuple[int, list[str]]] = field(default_factory=list)  # table: (line, raw cells)
    before: str = ""  # the paragraph just before (a fence's lead-in)
    end: int = 0  # para: 1-based last line


def _plain(cell: str) -> str:
    return re.sub(r"`|\*", "", cell).strip()


def _blocks(text: str) -> list[_Block]:
    tokens = MarkdownIt("commonmark").enable("table").parse(text)
    out: list[_Block] = []
    heads: list[tuple[int, str]] = []
    last_para = ""
    i = 0
    while i < len(tokens):
        t = tokens[i]
        line = (t.map[0] + 1) if t.map else 0
        if t.type == "heading_open":
            level = int(t.tag[1])
            heads = [h for h in heads if h[0] < level] + [(level, tokens[i + 1].content.strip())]
            last_para = ""
            i += 3
            continue
        titles = [h[1] for h in heads]
        if t.type == "paragraph_open":
            content = tokens[i + 1].content
            out.append(_Block("para", line, titles, text=content, end=t.map[1] if t.map else line))
            last_para = content
            i += 3
            continue
        if t.type == "fence" or t.type == "code_block":
            out.append(_Block("fence", line + (1 if t.type == "fence" else 0), titles, text=t.content,
                              info=t.info.strip(), before=last_para))
            i += 1
            continue
        if t.type == "table_open":
            header: list[str] = []
            rows: list[tuple[int, list[str]]] = []
            row_line = 0
            cells: list[str] = []
            in_head = False
            while tokens[i].type != "table_close":
                tk = tokens[i]
                if tk.type == "thead_open":
                    in_head = True
                elif tk.type == "thead_close":
                    in_head = False
                elif tk.type == "tr_open":
                    row_line, cells = (tk.map[0] + 1 if tk.map else 0), []
                elif tk.type == "inline":
                    cells.append(tk.content.strip())
                elif tk.type == "tr_close":
                    if in_head:
                        header = cells
                    else:
                        rows.append((row_line, cells))
                i += 1
            out.append(_Block("table", line, titles, header=[_plain(h).lower() for h in header], rows=rows))
            i += 1
            continue
        i += 1
    return out


def _col(header: list[str], *words: str) -> int | None:
    for n, h in enumerate(header):
        if any(w in h for w in words):
            return n
    return None


def _cell(row: list[str], n: int | None) -> str:
    return row[n] if n is not None and n < len(row) else ""


def _code_spans(cell: str) -> list[str]:
    return re.findall(r"`([^`]+)`", cell)


def _first_code(cell: str) -> str:
    spans = _code_spans(cell)
    return (spans[0] if spans else _plain(cell)).strip()


def _arch_in(text: str, arches: set[str]) -> str | None:
    """The one architecture ``text`` names (by kaniko or uname name), or None."""
    found = {_ARCH_WORDS.get(w.lower(), w.lower()) for w in re.findall(r"[A-Za-z0-9_]+", text)}
    hits = found & arches
    return hits.pop() if len(hits) == 1 else None


# ----------------------------------------------------------------------------- code blocks


def _logical_lines(content: str, first_line: int) -> list[tuple[int, str]]:
    """Join `\\` continuations; keep the line number where each logical line starts."""
    return [(words[0][0], " ".join(shlex.quote(w) for _, w in words)) for words in _word_lines(content, first_line)
            if words]


def _word_lines(content: str, first_line: int) -> list[list[tuple[int, str]]]:
    """Shell words of each logical line (`\\` continuations joined), each word with its own line number.

    A physical line whose quotes do not close is skipped (prose in a code block, not a command).
    """
    out: list[list[tuple[int, str]]] = []
    cur: list[tuple[int, str]] = []
    for n, raw in enumerate(content.splitlines(), first_line):
        t = raw.rstrip()
        cont = t.endswith("\\")
        t = t[:-1] if cont else t
        if not cur and (not t.strip() or t.strip().startswith("#")):
            continue
        try:
            cur.extend((n, w) for w in shlex.split(t, comments=True))
        except ValueError:
            cur = []
            continue
        if not cont:
            if cur:
                out.append(cur)
            cur = []
    if cur:
        out.append(cur)
    return out


def _is_launch_line(words: list[str]) -> bool:
    return any(w == "-e" or w.partition("=")[0] in _VALUE_FLAGS | _BOOL_FLAGS for w in words) or (
        words[:1] == ["iris"])


# A size as `iris job run` takes it: a number and a unit (a bare number would be bytes: never meant).
_IRIS_SIZE = re.compile(r"[0-9]+(?:\.[0-9]+)?(?:[KMGT]i?B?)", re.IGNORECASE)


class _NotASize(ValueError):
    def __init__(self, line: int, detail: str):
        super().__init__(detail)
        self.line, self.detail = line, detail


def _apply_words(tpl: LaunchTemplate, words: list[tuple[int, str]], skipped: list[str]) -> list[EnvPair]:
    """Fill ``tpl`` from one logical line of `iris job run` words; returns the `-e` pairs it held."""
    pairs: list[EnvPair] = []
    i = 0
    while i < len(words):
        line, w = words[i]
        if w == "--":
            if not tpl.command and i + 1 < len(words):
                tpl.command = [x for _, x in words[i + 1:]]
                tpl.lines["command"] = words[i + 1][0]
            break
        if w in ("iris", "job", "run"):
            i += 1
            continue
        if w == "-e":
            if i + 2 < len(words) and _VAR.match(words[i + 1][1]):
                pairs.append(EnvPair(name=words[i + 1][1], value=words[i + 2][1], line=line))
                i += 3
            else:
                skipped.append(f"line {line}: `-e` needs NAME VALUE (two arguments)")
                i += 2
            continue
        flag, eq, inline = w.partition("=")
        if flag in _BOOL_FLAGS and not eq:
            tpl.flags[flag] = True
            if flag in _FIELD_OF_FLAG:
                _set(tpl, _FIELD_OF_FLAG[flag], True, line)
            if flag in ("--preemptible", "--no-preemptible"):
                tpl.preemptible = flag == "--preemptible"
            i += 1
            continue
        if flag in _VALUE_FLAGS:
            if eq:
                value, i = inline, i + 1
            elif i + 1 < len(words):
                value, i = words[i + 1][1], i + 2
            else:
                skipped.append(f"line {line}: {flag} without a value")
                i += 1
                continue
            tpl.flags[flag] = value
            name = _FIELD_OF_FLAG.get(flag)
            if name in ("memory", "disk") and not _IRIS_SIZE.fullmatch(value):
                nxt = words[i][1] if i < len(words) else ""
                hint = f" (`{value} {nxt}`: write it without the space, `{value}{nxt}`)" if re.fullmatch(
                    r"[0-9.]+", value) and _IRIS_SIZE.fullmatch(value + nxt) else ""
                raise _NotASize(line, f"{flag} {value!r} is not a size such as 512GB{hint}")
            if name:
                try:
                    typed = {"cpu": float, "max_retries": int, "timeout_s": int}.get(name, str)(value)
                except ValueError:
                    skipped.append(f"line {line}: {flag} {value!r} is not a number")
                    continue
                _set(tpl, name, typed, line)
            continue
        skipped.append(f"line {line}: `{w}` is not an `iris job run` flag the service uses")
        i += 1
    return pairs


def _set(tpl: LaunchTemplate, name: str, value, line: int) -> None:
    """The first statement wins; a later different one is recorded (``conflicts``) for the report."""
    current = getattr(tpl, name)
    if current is None:
        setattr(tpl, name, value)
        tpl.lines[name] = line
    elif current != value and line != tpl.lines.get(name):
        tpl.flags.setdefault("_conflicts", "")
        tpl.flags["_conflicts"] = str(tpl.flags["_conflicts"]) + (
            f"line {line}: {name} {value} ignored; line {tpl.lines.get(name)} states {current}\n")


def _is_megatron(pair: EnvPair, megatron_var: str | None) -> bool:
    return pair.name == megatron_var or "megatron" in pair.value.lower() or "MEGATRON" in pair.name


def _read_fence(b: _Block, arches: set[str], templates: dict[str, LaunchTemplate], megatron: list[EnvPair],
                megatron_var: str | None, skipped: list[str]) -> None:
    launch: list[list[tuple[int, str]]] = []
    for words in _word_lines(b.text, b.line):
        first = words[0][1]
        body = [w for _, w in (words[1:] if re.fullmatch(r"[A-Za-z0-9_]+:", first) else words)]
        if body and _is_launch_line(body):
            launch.append(words)
    if not launch:
        return
    command = next((" ".join(w for _, w in words[i + 1:]) for words in launch
                    for i, (_, w) in enumerate(words) if w == "--"), None)
    if command is not None and not re.search(r"base64|build", command):
        skipped.append(f"line {b.line}: an `iris job run` for another command ({command[:60]!r}), not the image build")
        return
    context = " ".join(b.headings[-1:]) + " " + b.before
    block_arch = _arch_in(b.headings[-1] if b.headings else "", arches)
    only_env = all(w[0][1] == "-e" for w in launch) and not any(x == "--" for w in launch for _, x in w)
    megatron_block = only_env and "megatron" in context.lower()
    for words in launch:
        arch = block_arch
        if (m := re.fullmatch(r"([A-Za-z0-9_]+):", words[0][1])) and _arch_in(m.group(1), arches):
            arch, words = _arch_in(m.group(1), arches), words[1:]
        elif m and _ARCH_WORDS.get(m.group(1).lower()):
            # A line for an architecture the script does not build: never a template for the others.
            skipped.append(f"line {words[0][0]}: the `{m.group(1)}:` resource line is for an architecture the "
                           f"build script does not build ({', '.join(sorted(arches))}); ignored")
            continue
        cluster = next((w.partition("=")[2] or (words[i + 1][1] if i + 1 < len(words) else "")
                        for i, (_, w) in enumerate(words) if w.partition("=")[0] == "--cluster"), None)
        if arch is None and (words[0][1] == "iris" or cluster):
            arch = _arch_in(" ".join(w for _, w in words), arches)
        # A template that names only its cluster is placed by the placements table (see parse_ops).
        key = arch or (f"cluster:{cluster}" if cluster else "*")
        tpl = templates.setdefault(key, LaunchTemplate(arch=key, line=words[0][0]))
        for pair in _apply_words(tpl, words, skipped):
            if megatron_block or _is_megatron(pair, megatron_var):
                if pair.name not in {p.name for p in megatron}:
                    megatron.append(pair)
            elif pair.name not in {p.name for p in tpl.env}:
                tpl.env.append(pair)


# ----------------------------------------------------------------------------- tables


def _boundary(b: _Block, path: str, skipped: list[str]) -> list[DeployRule]:
    p_col = _col(b.header, "path")
    r_col = _col(b.header, "rebuild")
    h_col = _col(b.header, "reach", "how", "effect")
    out = []
    for n, row in b.rows:
        glob = _first_code(_cell(row, p_col))
        if glob and "/" not in glob and "*" not in glob and "." not in glob:
            glob += "/**"
        decided = _cell(row, r_col) if r_col is not None else _cell(row, h_col)
        low = _plain(decided).lower()
        if re.search(r"\b(no|false)\b|no rebuild|not require", low):
            rebuild = False
        elif re.search(r"\b(yes|true|required)\b|rebuild", low):
            rebuild = True
        else:
            skipped.append(f"line {n}: cannot tell whether `{glob}` needs an image rebuild ({decided!r})")
            continue
        out.append(DeployRule(glob=glob, rebuild=rebuild, reaches=_plain(_cell(row, h_col)), line=n, source=f"{path}:{n}"))
    return out


def _contract_rows(b: _Block, wheel_source_var: str | None, wheel_sources: list[str]) -> list[ContractRow]:
    v_col = _col(b.header, "variable", "env")
    w_col = _col(b.header, "when", "condition", "required")
    s_col = _col(b.header, "source", "how", "where")
    rows = []
    for n, row in b.rows:
        names = [x for x in _code_spans(_cell(row, v_col)) if _VAR.match(x)] or (
            [x] if _VAR.match(x := _plain(_cell(row, v_col))) else [])
        when = _cell(row, w_col)
        for name in names:
            r = ContractRow(variable=name, required_when=when, source=_cell(row, s_col), line=n)
            low = _plain(when).lower()
            if low.startswith("always"):
                r.always = True
            elif m := re.search(r"`?([A-Z_][A-Z0-9_]*)\s*(=|!=)\s*([A-Za-z0-9_.-]+)`?", _plain(when)):
                r.when = [Condition(var=m.group(1), op=m.group(2), value=m.group(3))]  # type: ignore[arg-type]
            elif m := re.match(r"optional(?:\s*\(default:\s*(.*?)\))?", _plain(when), re.I):
                r.optional_default = (m.group(1) or "").strip().strip("`")
            elif wheel_source_var and (hit := [w for w in wheel_sources if w in low]):
                r.when = [Condition(var=wheel_source_var, op="=", value=hit[0])]
            else:
                r.understood = False
            rows.append(r)
    return rows


def _placements(b: _Block) -> dict[str, Placement]:
    a_col = _col(b.header, "arch")
    c_col = _col(b.header, "cluster")
    p_col = _col(b.header, "priority")
    t_col = _col(b.header, "tag")
    out = {}
    for n, row in b.rows:
        arch = _ARCH_WORDS.get(_first_code(_cell(row, a_col)).lower(), _first_code(_cell(row, a_col)).lower())
        cluster = _first_code(_cell(row, c_col))
        if arch and cluster:
            out[arch] = Placement(arch=arch, cluster=cluster, priority=_first_code(_cell(row, p_col)) or None, line=n,
                                  tag_forms=_code_spans(_cell(row, t_col)) if t_col is not None else [])
    return out


def _resource_table(b: _Block, arches: set[str], templates: dict[str, LaunchTemplate], skipped: list[str]) -> None:
    """| arch | cpu | memory | disk | gpu | priority | timeout | retries |: launch values per architecture."""
    a_col = _col(b.header, "arch")
    cols = {name: _col(b.header, *words) for name, words in (
        ("cpu", ("cpu",)), ("memory", ("memory", "ram")), ("disk", ("disk",)), ("gpu", ("gpu", "accelerator")),
        ("max_retries", ("retries", "retry")), ("timeout_s", ("timeout",)))}
    if not any(v is not None for v in cols.values()):
        return
    for n, row in b.rows:
        arch = _arch_in(_plain(_cell(row, a_col)), arches)
        if arch is None:
            continue
        tpl = templates.setdefault(arch, LaunchTemplate(arch=arch, line=n))
        for name, col in cols.items():
            raw = _first_code(_cell(row, col))
            if col is None or not raw or raw.lower() in ("-", "none", "no"):
                continue
            try:
                value = {"cpu": float, "max_retries": int, "timeout_s": int}.get(name, str)(raw.split()[0])
            except ValueError:
                skipped.append(f"line {n}: {name} {raw!r} is not a number")
                continue
            _set(tpl, name, value, n)


def _key_values(b: _Block) -> dict[str, tuple[int, str]]:
    return {_plain(r[0]).lower(): (n, _cell(r, 1)) for n, r in b.rows if r}


def _artifact(fields: dict[str, tuple[int, str]], schemes: list[str] | None, path: str) -> WheelArtifact | None:
    def get(*keys: str) -> tuple[int, str]:
        for k, v in fields.items():
            if any(x in k for x in keys):
                return v[0], _first_code(v[1])
        return 0, ""

    line, uri = get("uri")
    sha = get("sha256", "sha", "digest")[1]
    if not uri and not sha:
        return None
    u_line, usable_text = get("usable")
    stated = _plain(usable_text).lower() in ("yes", "true")
    reasons = []
    if not stated:
        reasons.append("the ops doc marks it not usable" if u_line else "the ops doc does not state it usable")
    if not re.fullmatch(r"[0-9a-f]{64}", sha):
        reasons.append("its SHA-256 is not a full 64-hex value")
    if not uri or (schemes and not any(uri.startswith(s) for s in schemes)):
        reasons.append("its URI scheme is not one the script accepts")
    return WheelArtifact(uri=uri or None, sha256=sha or None, manifest_platform=get("platform")[1] or None,
                         stated_usable=stated, usable=not reasons, reason="; ".join(reasons) or "usable", line=line)


# ----------------------------------------------------------------------------- sentences


def _ceiling_from_rows(fields: dict[str, tuple[int, str]], c: ProseCeiling, skipped: list[str]) -> None:
    for key, (n, v) in fields.items():
        try:
            if key.startswith(("max", "largest")):
                c.max_layer_bytes, c.lines["max_layer_bytes"] = parse_bytes(_plain(v)), n
            elif key.startswith(("flag", "warn")):
                c.warn_layer_bytes, c.lines["warn_layer_bytes"] = parse_bytes(_plain(v)), n
            elif key.startswith("min") and _plain(v).isdigit():
                c.min_layers, c.lines["min_layers"] = int(_plain(v)), n
        except ContractError:
            skipped.append(f"line {n}: layer ceiling value {v!r} is not a size")


def _ceiling_from_sentence(b: _Block, c: ProseCeiling) -> None:
    for sentence in re.split(r"(?<=[.;])\s+", b.text):
        low = sentence.lower()
        if "layer" not in low:
            continue
        m = _SIZE.search(sentence)
        n = b.line + b.text[: b.text.find(sentence)].count("\n") if sentence in b.text else b.line
        if m and c.max_layer_bytes is None and re.search(r"below|under|ceiling|maximum|at most|must stay|less than",
                                                         low):
            c.max_layer_bytes, c.lines["max_layer_bytes"] = parse_bytes(m.group(0)), n
        elif m and c.warn_layer_bytes is None and re.search(r"\b(flag|warn)", low):
            c.warn_layer_bytes, c.lines["warn_layer_bytes"] = parse_bytes(m.group(0)), n
        if c.min_layers is None and (mm := re.search(r"at least (\d+) layers", low)):
            c.min_layers, c.lines["min_layers"] = int(mm.group(1)), n


_RESOURCE_FLAGS = {"--cpu", "--memory", "--disk", "--gpu", "--priority", "--max-retries", "--timeout", "--task-image"}


def _resource_flags_only(span: str) -> bool:
    """`--cpu 96 --memory 640GB`: nothing but resource flags, each with its value."""
    words = span.split()
    if not words or len(words) % 2 and not all("=" in w for w in words):
        return False
    i = 0
    while i < len(words):
        flag, eq, _ = words[i].partition("=")
        if flag not in _RESOURCE_FLAGS:
            return False
        i += 1 if eq else 2
    return True


def _flags_from_inline_code(b: _Block, arches: set[str], templates: dict[str, LaunchTemplate],
                            skipped: list[str]) -> None:
    """"For arm64 add `--gpu GB200x1 --cpu 96 --memory 640GB`": flags in inline code of a sentence that
    names exactly one architecture (a sentence naming none or both is ambiguous and left alone)."""
    for sentence in re.split(r"(?<=[.;])\s+", b.text):
        spans = [x for x in _code_spans(sentence) if _resource_flags_only(x)]
        if not spans:
            continue
        arch = _arch_in(re.sub(r"`[^`]*`", " ", sentence), arches) or _arch_in(
            b.headings[-1] if b.headings else "", arches)  # or the section's architecture
        n = b.line + b.text[: b.text.find(sentence)].count("\n") if sentence in b.text else b.line
        if arch is None:
            skipped.append(f"line {n}: launch flags in a sentence that names no single architecture")
            continue
        tpl = templates.setdefault(arch, LaunchTemplate(arch=arch, line=n))
        for span in spans:
            words = [(n, w) for w in (_word_lines(span, n) or [[]])[0] for w in [w[1]]]
            _apply_words(tpl, words, skipped)


def _common_from_sentence(b: _Block, templates: dict[str, LaunchTemplate]) -> None:
    """`--no-sync` is required / Every job uses `<image>`, `--no-sync`, ...: flags for every job."""
    for sentence in re.split(r"(?<=[.:])\s+", b.text):
        low = sentence.lower()
        if not re.search(r"required|mandatory|every job uses|must|always", low):
            continue
        n = b.line + b.text[: b.text.find(sentence)].count("\n") if sentence in b.text else b.line
        spans = _code_spans(sentence)
        tpl = None
        for span in spans:
            if span in _BOOL_FLAGS and span in _FIELD_OF_FLAG and not re.search(r"\bnot\b|never", low):
                tpl = tpl or templates.setdefault("*", LaunchTemplate(arch="*", line=n))
                _set(tpl, _FIELD_OF_FLAG[span], True, n)
            elif "every job uses" in low and re.fullmatch(r"[\w.-]+(/[\w.-]+)*:[\w.-]+", span):
                tpl = tpl or templates.setdefault("*", LaunchTemplate(arch="*", line=n))
                _set(tpl, "task_image", span, n)


# ----------------------------------------------------------------------------- entry point


def parse_ops(
    text: str | None,
    path: str = OPS_PATH,
    *,
    uri_schemes: list[str] | None = None,
    arches: list[str] | None = None,
    wheel_source_var: str | None = None,
    wheel_sources: list[str] | None = None,
    megatron_var: str | None = None,
) -> OpsContract:
    """Every fact the ops doc states; ``text`` None means the file does not exist at the commit.

    The keyword arguments come from the build script (what it accepts), so prose is read in its terms.
    """
    if text is None:
        return OpsContract(path=path, found=False)
    known = set(arches or ("amd64", "arm64"))
    try:
        return _parse_ops(text, path, known, uri_schemes=uri_schemes, wheel_source_var=wheel_source_var,
                          wheel_sources=wheel_sources, megatron_var=megatron_var)
    except _NotASize as e:
        raise ContractError(path, e.line, "a resource size such as 512GB", e.detail) from None


def _parse_ops(text: str, path: str, known: set[str], *, uri_schemes, wheel_source_var, wheel_sources,
               megatron_var) -> OpsContract:
    skipped: list[str] = []
    ops = OpsContract(path=path)
    ceiling = ProseCeiling()
    artifact_fields: dict[str, tuple[int, str]] = {}
    for b in _blocks(text):
        heading = " ".join(b.headings).lower()
        if b.kind == "table":
            h = b.header
            if _col(h, "variable") is not None:
                ops.contract_rows += _contract_rows(b, wheel_source_var, wheel_sources or [])
            elif _col(h, "path") is not None:
                ops.deploy_boundary += _boundary(b, path, skipped)
            elif _col(h, "arch") is not None and (_col(h, "cluster") is not None or _col(h, "cpu", "memory")
                                                  is not None):
                if _col(h, "cluster") is not None:
                    ops.placements.update(_placements(b))
                _resource_table(b, known, ops.templates, skipped)
            elif len(h) == 2 and b.rows:
                kv = _key_values(b)
                if any("uri" in k for k in kv):
                    artifact_fields.update(kv)
                elif "layer" in heading or "ceiling" in heading or any("layer" in k for k in kv):
                    _ceiling_from_rows(kv, ceiling, skipped)
        elif b.kind == "fence":
            _read_fence(b, known, ops.templates, ops.megatron_env, megatron_var, skipped)
            for n, t in _logical_lines(b.text, b.line):
                if m := re.fullmatch(r"(PREBUILT_WHEEL_ARTIFACT_\w+|WHEEL_ARTIFACT_\w+)=(\S+)", t):
                    key = "uri" if m.group(1).endswith("URI") else "sha256" if "SHA" in m.group(1) else m.group(1)
                    artifact_fields.setdefault(key, (n, f"`{m.group(2)}`"))
        else:
            _ceiling_from_sentence(b, ceiling)
            _common_from_sentence(b, ops.templates)
            _flags_from_inline_code(b, known, ops.templates, skipped)
    for key in [k for k in ops.templates if k.startswith("cluster:")]:
        tpl = ops.templates.pop(key)
        hit = [a for a, p in ops.placements.items() if p.cluster == key[8:]]
        if len(hit) == 1 and hit[0] not in ops.templates:
            tpl.arch = hit[0]
            ops.templates[hit[0]] = tpl
        else:
            skipped.append(f"line {tpl.line}: a launch template for cluster {key[8:]} that no placement "
                           "names for exactly one architecture")
    ops.layer_ceiling = ceiling
    ops.wheel_artifact = _artifact(artifact_fields, uri_schemes, path)
    for tpl in ops.templates.values():
        skipped += [c for c in str(tpl.flags.pop("_conflicts", "")).splitlines() if c]
    skipped += [f"line {r.line}: the condition of {r.variable} ({r.required_when!r}) is prose the service "
                "does not compare with the script" for r in ops.contract_rows if not r.understood]
    ops.skipped = skipped
    return ops
