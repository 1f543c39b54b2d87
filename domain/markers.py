"""Assertion markers a successful build log must show, derived from the contract at the build commit.

Why derived: the markers are whatever the script and the Dockerfile's RUN steps echo on the path this
(arch, variant, wheel source) takes, plus kaniko's final push. Reading them from the files means a
Dockerfile that adds or drops an assertion changes the check with it; nothing is hard-coded here
except kaniko's push lines.
"""

from __future__ import annotations

import bisect
import hashlib
import re
from typing import Literal

from pydantic import BaseModel

from domain.contract import BuildContract, EchoLine
from domain.contract.models import Stage, guards_hold
from domain.contract.script import errexit_covers, shell_values
from domain.contract.shell import template_vars

_PART = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)(?::-([^}]*))?\}|\$([A-Za-z_][A-Za-z0-9_]*)|\$\([^)]*\)")
DIGEST_RE = r"sha256:([0-9a-f]{64})"


class Marker(BaseModel):
    """One expected log line: ``text`` (exact substring) or ``pattern`` (regex, searched per log)."""

    name: str
    text: str | None = None
    pattern: str | None = None
    source: str  # "script", a Dockerfile path, or "kaniko"
    role: Literal["assert", "push", "pushed"] = "assert"
    template: str | None = None  # the unexpanded echo text, as a kaniko cache-hit line quotes it
    # "script": a script echo that must have run for the final push to happen (the script stops at its first
    # error, `set -e`, and prints it before kaniko): our image at the tag proves it when the log lost it.
    image_proof: Literal["script"] | None = None
    line: int = 0  # the source line of the echo (the script's: errexit is read per line)
    # What the judge of a log that lost lines needs (domain/log_evidence.py):
    conditional: bool = False  # printed on a branch (if/case/&&) the plan selects: its step alone proves nothing
    values: dict[str, str] = {}  # the variables its text expands -> the planned value (a value marker)
    # The text with every planned value left open: an own-output line of this shape that the marker does not
    # match shows another value (`done (megatron=0)` where the plan says 1).
    shape: str | None = None
    step: str | None = None  # a Dockerfile echo: its RUN instruction as written (kaniko's history `created_by`)
    must_run: bool = False  # an unguarded `echo` in its step's final `&&` chain: the step's zero exit ran it
    excludes: list[str] = []  # lines of the branch the plan excludes, printed by the same step
    # Its step only tests and prints (EchoLine.check_step): the image can be asked by running the step in it, with
    # ``step_env`` (the planned build args the step reads) as defaults under the image's own ENV.
    check_step: bool = False
    step_env: dict[str, str] = {}
    # A value or branch marker a kaniko cache hit of its step proves (domain/markers.py _cache_proves): its values,
    # and the tests that choose its branch, read only ARGs of the step's cache key with the planned values.
    cache_proof: bool = False
    # Those ARGs -> their planned values: an ENV of the image (its base image's too) that sets one, or the log's
    # traced kaniko command passing another value (``traced_build_args``), voids the proof.
    cache_vars: dict[str, str] = {}
    # A Dockerfile echo: ``step_key(step)`` of its RUN instruction (a short digest, so every marker carries it at a
    # few bytes): a kaniko cache-hit line counts for the marker only where it quotes exactly this step.
    step_key: str | None = None

    @property
    def carries_value(self) -> bool:
        """Its text expands a variable (a planned value, or one only the build knows): only a line showing it
        proves it."""
        return bool(self.values) or self.pattern is not None

    def search(self, log: str, start: int = 0) -> re.Match[str] | None:
        rx = self.pattern if self.pattern is not None else re.escape(self.text or "")
        return re.compile(rx, re.M).search(log, start)


class MarkerCheck(BaseModel):
    found: list[str]
    missing: list[str]
    cached: list[str] = []  # satisfied by kaniko reusing the cached layer of the step that prints them
    # Missing markers whose very step kaniko took from its cache (so this build never printed them) and which that
    # cache hit cannot prove: marker -> "unproven (kaniko took its step from the cache: <file:line>, `RUN …`): why".
    cache_unproven: dict[str, str] = {}
    final_push_seen: bool
    pushed_digest: str | None  # "sha256:<64 hex>" of the final push
    # Lines of the build's own output that contradict the plan (another value, the excluded branch): each names
    # the log line and what the plan expects. A shown line is proven whatever else the log lost.
    contradicted: list[str] = []


def _to_marker(template: str, env: dict[str, str], source: str, source_text: str | None = None) -> Marker:
    """Resolve known variables; anything else (a shell local, `$(...)`) becomes a wildcard."""
    literal: list[str] = []
    regex: list[str] = []
    shape: list[str] = []
    values: dict[str, str] = {}
    wild = False
    pos = 0
    for m in _PART.finditer(template):
        lit = template[pos:m.start()]
        literal.append(lit)
        regex.append(re.escape(lit))
        shape.append(re.escape(lit))
        pos = m.end()
        name = m.group(1) or m.group(3)
        default = m.group(2)
        if name and name in env and (env[name] != "" or default is None):
            value = env[name]
        elif name and default is not None and name in env:
            value = default
        else:
            wild = True
            literal.append("…")
            regex.append(r"\S.*?")
            shape.append(r"\S.*?")
            continue
        literal.append(value)
        regex.append(re.escape(value))
        shape.append(r"(.+?)")
        values[name] = value
    literal.append(template[pos:])
    regex.append(re.escape(template[pos:]))
    shape.append(re.escape(template[pos:]))
    name = "".join(literal).strip()
    lit_chars = len(re.sub(r"\s", "", "".join(template[a:b] for a, b in _literal_spans(template))))
    out = Marker(name=name, source=source, template=source_text or template, values=values,
                 shape="".join(shape) if values and lit_chars >= 6 else None,
                 **({"pattern": "".join(regex)} if wild else {"text": "".join(literal)}))
    return out


def _literal_spans(template: str) -> list[tuple[int, int]]:
    spans, pos = [], 0
    for m in _PART.finditer(template):
        spans.append((pos, m.start()))
        pos = m.end()
    spans.append((pos, len(template)))
    return spans


def _knob_values(contract: BuildContract, arch: str, job_env: dict[str, str]) -> dict[str, str]:
    """Shell values the script will hold for this arch and job env (arch table and knob defaults resolved)."""
    return shell_values(contract.script, arch, job_env, contract.commit)


def variant_env(contract: BuildContract, variant: str) -> dict[str, str]:
    """The add-on env a variant sets (Megatron: the ops doc's `-e` pairs; standard: none)."""
    if variant == "megatron":
        return {e.name: e.value for e in contract.megatron_env}  # ops doc, else config build.megatron_env
    return {}


def expected_markers(
    contract: BuildContract,
    arch: str,
    variant: str,
    wheel_source: str,
    tag: str,
    *,
    image_repository: str | None = None,
    job_env: dict[str, str] | None = None,
) -> list[Marker]:
    """Markers for one target, in log order (script, Dockerfile chain, final push)."""
    s = contract.script
    a = contract.arch(arch)
    env = {**variant_env(contract, variant), **(job_env or {}), s.wheel_source_var: wheel_source}
    if image_repository:
        env[s.image_repository_var] = image_repository
    if a.dockerfile_env:
        env.setdefault(a.dockerfile_env, a.dockerfile)  # the service passes the arch's Dockerfile explicitly
    values = _knob_values(contract, arch, env)
    repo = values.get(s.repository_local, image_repository or s.image_repository_default)
    df = contract.dockerfiles.get(values.get(s.knobs[s.dockerfile_var].local, a.dockerfile)
                                  if s.dockerfile_var else a.dockerfile) or contract.dockerfiles[a.dockerfile]
    for k, v in df.pins.items():  # the pin loop sets these; a knob the job sets (INSTALL_MEGATRON) wins
        values.setdefault(k, v)
    cond_env = {**values, **env}
    markers: list[Marker] = []

    # Script: pin lines, then its stdout echoes on this path.
    pins = list(s.pinned_args) + [p.name for p in s.conditional_pinned_args
                                  if all(c.holds(cond_env) for c in p.when)]
    if s.pin_echo:
        dockerfile_local = s.knobs[s.dockerfile_var].local if s.dockerfile_var else "DOCKERFILE"
        for pin in pins:
            pin_values = {**values, s.pin_loop_var: pin, dockerfile_local: df.path}
            if s.pin_value_var:
                pin_values[s.pin_value_var] = df.pins.get(pin, "")
            markers.append(_to_marker(s.pin_echo, pin_values, "script"))
    pin_line = s.lines.get("pinned_args", 0)
    for m in markers:
        m.line = pin_line
    markers.extend(m for m, _ in _echo_markers(s.echoes, cond_env, values, "script"))
    for m in markers:  # the script's: under errexit (as bash reads it) the final push proves they ran
        if m.line and errexit_covers(s.errexit_spans, m.line):
            m.image_proof = "script"

    # Dockerfile: the final target's stage chain with its build args (a stage's own ARG defaults apply from that
    # stage on, never to the stages before it).
    passed = {"GITSHA": contract.commit, s.wheel_source_var: wheel_source}
    if s.megatron_var:
        passed[s.megatron_var] = values.get(s.knobs[s.megatron_var].local, "0")
    # The pin loop sets each checked pin as the Dockerfile declares it (`printf -v "$pin" "$value"`); where the
    # script passes it as a build arg, that value overrides a stage's default.
    passed.update({p: df.pins[p] for p in pins if p in df.pins and p in (s.build_args or {})})
    build_env = dict(df.pins)
    chain = df.chain()
    for i, stage in enumerate(chain):
        build_env.update({k: v for k, v in stage.args.items() if v is not None})
        build_env.update(passed)
        stage_markers = _echo_markers(stage.echoes, build_env, build_env, df.path)
        for m, e in stage_markers:
            keyed = _cache_proves(m, e, chain[:i + 1], passed, df.pins, s.build_args, build_env)
            m.cache_proof, m.cache_vars = keyed is not None, keyed or {}
        markers.extend(m for m, _ in stage_markers)

    # kaniko's final push of this tag (the wheels push has another tag and does not count).
    markers.append(Marker(name=f"push {repo}:{tag}", text=f"Pushing image to {repo}:{tag}",
                          source="kaniko", role="push"))
    markers.append(Marker(name=f"pushed {repo}@sha256", pattern=re.escape(f"Pushed {repo}@") + DIGEST_RE,
                          source="kaniko", role="pushed"))
    for m in markers:  # payloads stay small: the step text only where a judgement reads it
        needed = m.check_step or (m.must_run and not m.carries_value and not m.conditional)
        if not needed:
            m.step = None
    seen: dict[str, int] = {}
    for m in markers:
        n = seen.get(m.name, 0)
        seen[m.name] = n + 1
        if n:
            m.name = f"{m.name} #{n + 1}"
    return markers


def _cache_proves(m: Marker, e: EchoLine, chain: list[Stage], passed: dict[str, str], pins: dict[str, str],
                  build_args: dict[str, str] | None, planned: dict[str, str]) -> dict[str, str] | None:
    """The ARGs whose keyed values let a kaniko cache hit of the step that prints ``m`` prove it, or None where a
    hit cannot. Why a hit can: kaniko caches only a step that exited 0, under a key of the step's text AND every
    build arg and ENV value in force there (populateCompositeKey: args.ReplacementEnvs(env)), so the reused
    layer's step ran on the very values this build's would have. It then printed:
    - a value marker (``m.values``) printed unconditionally by a zero exit (``must_run``): the planned values;
    - a branch marker (``m.conditional``) in the final `&&` chain of an `if` branch that is the step's final
      statement (``EchoLine.runs_when``), where every test choosing that branch reads only such ARGs: those
      values chose the planned branch, and the step's zero exit ran the chain (its values keyed likewise).
    Each ARG must be declared by the step's stage (``chain[-1]``) before it, set by no ENV of the chain (ENV wins
    over ARG, and is not what we planned), and hold the plan's value: what the job passes (our knobs, the pins),
    else the stage's default or the pin it imports, where the script passes no other `--build-arg` of that name.
    One RUN step of the file must hold the echo (``only_step``), and no wildcard may remain in its text."""
    if m.pattern is not None or not e.only_step:
        return None
    need: dict[str, str] = dict(m.values)
    if m.conditional:
        if not e.runs_when or any(g.opaque is not None for g in e.runs_when):
            return None
        for g in e.runs_when:
            for clause in g.dnf():
                for c in clause:
                    if c.var not in planned:
                        return None
                    need[c.var] = planned[c.var]
        if guards_hold(e.runs_when, need) is not True:
            return None
    elif not (m.values and m.must_run):
        return None
    stage = chain[-1]
    for name, value in need.items():
        declared = stage.arg_lines.get(name)
        if declared is None or declared >= e.line:
            return None  # not an ARG of this stage at the step: the key holds no value we planned
        if any(name in st.env_lines and (st is not stage or st.env_lines[name] < e.line) for st in chain):
            return None  # an ENV sets it: that value, not the planned one, is what the step read
        if build_args is None:
            return None  # the script passes build args we cannot name: any default may be overridden
        if name in build_args:
            if name not in passed or build_args[name] not in (f"${name}", f"${{{name}}}"):
                return None  # the script passes a value we do not plan (only `NAME=$NAME` carries ours)
            keyed = passed[name]
        else:
            default = stage.args.get(name)
            keyed = default if default is not None else pins.get(name)
        if keyed is None or keyed != value:
            return None
    return need


def _echo_markers(echoes: list[EchoLine], cond_env: dict[str, str], values: dict[str, str],
                  source: str) -> list[tuple[Marker, EchoLine]]:
    """The echoes printed on the planned path; the lines of a branch the plan excludes go to ``excludes`` of a
    marker of the same step (else of the same file), so a log showing them fails the plan."""
    out: list[Marker] = []
    lines: list[EchoLine] = []
    excluded: list[tuple[EchoLine, str]] = []
    for e in echoes:
        if e.in_loop:
            continue
        holds = guards_hold(e.guards, cond_env)
        if holds is not True:
            if holds is False:
                x = _to_marker(e.template, values, source, e.source_text)
                if x.text is not None and len(x.text.strip()) >= 8:
                    excluded.append((e, x.text))
            continue
        m = _to_marker(e.template, values, source, e.source_text)
        m.line, m.conditional, m.step, m.must_run = e.line, bool(e.guards), e.step, e.must_run
        m.step_key = step_key(e.step) if e.step else None
        if e.step and e.check_step and not m.values:  # a planned value it prints would come from us, not the image
            m.check_step = True
            m.step_env = {v: cond_env[v] for v in dict.fromkeys(template_vars(e.step)) if v in cond_env}
        out.append(m)
        lines.append(e)
    planned = {m.text for m in out if m.text}
    for e, text in excluded:
        if text in planned or any(text in p or p in text for p in planned):
            continue
        owner = next((m for m in out if e.step and m.step == e.step), out[0] if out else None)
        if owner is not None and text not in owner.excludes:
            owner.excludes.append(text)
    return list(zip(out, lines, strict=True))


# kaniko's own lines (logrus: `INFO[0003] RUN if …; then echo "…"`, `No cached layer found for cmd RUN …`, also
# colored or `level=info msg=`), after the log store's `[key source] ` prefix; and a shell's xtrace of an echo.
# They quote commands, never their output: a marker seen only there is not proven.
_NOT_OUTPUT = re.compile(
    r"^(?:\[[^\]\n]*\] )?(?:\x1b\[[0-9;]*m)*(?:"
    r"(?:INFO|WARN|WARNING|ERRO|ERROR|DEBU|DEBUG|TRAC|FATA|PANI)(?:\x1b\[[0-9;]*m)*(?:\[[^\]\n]*\]|[ :])"
    r"|(?:time=\S+ )?level=\w+ msg="
    r"|\++ (?:echo|printf|print)\b)")


_STORE_PREFIX = re.compile(r"^\[/\S+ \S+\] ")  # `[/<user>/<job>/<task>:<attempt> stdout] ` (activities/build.py)


def own_output(log_text: str) -> tuple[str, list[int]]:
    """The build's own output lines (kaniko's lines and xtrace removed), joined, and each one's 1-based line
    number in ``log_text``."""
    kept: list[str] = []
    numbers: list[int] = []
    for i, line in enumerate(log_text.splitlines(), 1):
        if not _NOT_OUTPUT.match(line):
            kept.append(line)
            numbers.append(i)
    return "\n".join(kept), numbers


def check_log(markers: list[Marker], log_text: str) -> MarkerCheck:
    """Which markers the build's own output shows; the final push counts only as `Pushing image to` then
    `Pushed` (kaniko's lines). A marker whose step kaniko took from its cache (``cache_hit_of``) was never printed
    by this build: the hit stands in for it only where it proves the line (``cache_proves_line``), else the
    marker is missing with that reason in ``cache_unproven``. Lines that show a marker's text with another value,
    or a branch the plan excludes, are ``contradicted``."""
    found: list[str] = []
    missing: list[str] = []
    push_end: int | None = None
    digest: str | None = None
    own, numbers = own_output(log_text)
    hits = cache_hits(log_text)
    traced = traced_build_args(log_text)
    cached: list[str] = []
    unproven: dict[str, str] = {}
    for m in markers:
        if m.role == "assert":
            if m.search(own):
                found.append(m.name)
                continue
            hit = cache_hit_of(m, hits)
            why = cache_proves_line(m, traced) if hit is not None else None
            if hit is not None and why is None:
                # kaniko skipped the step: its layer, built earlier from identical inputs (same cache key: the
                # step, its parent layers, the build args and ENV in force), already printed this line.
                cached.append(m.name)
                continue
            missing.append(m.name)
            if hit is not None:
                unproven[m.name] = cache_unproven_reason(m, hit, why or "")
        elif m.role == "push":
            hit = m.search(log_text)
            if hit:
                found.append(m.name)
                push_end = hit.end()
            else:
                missing.append(m.name)
        else:
            hit = m.search(log_text, push_end) if push_end is not None else None
            if hit:
                found.append(m.name)
                digest = "sha256:" + hit.group(1)
            else:
                missing.append(m.name)
    return MarkerCheck(found=found, missing=missing, cached=cached, cache_unproven=unproven,
                       final_push_seen=digest is not None, pushed_digest=digest,
                       contradicted=_contradictions(markers, own, numbers))


# ------------------------------------------------------------------------------------------- kaniko's cache
# What a cache hit is (kaniko, pkg/executor/build.go optimize + populateCompositeKey): before running a RUN step,
# kaniko hashes a composite key of the base image digest, every earlier instruction of the stage chain (COPY'd
# files by content), the build args and ENV values in force (args.ReplacementEnvs) and the step's own text; a layer
# pushed to --cache-repo under that key is reused instead of running the step, and kaniko logs
# `Using caching version of cmd: RUN <the instruction as written>`. A layer is pushed only after its step exited 0.
# So a hit proves: this very step ran once, on exactly these inputs, and exited 0, in an earlier build whose log
# is not this one. It proves a line that step prints whenever it exits 0 (an unguarded fixed echo of its final
# `&&` chain), and a planned value only where that value is an input of the key (``Marker.cache_proof``). It does
# not prove a branch (the service does not decide from the key which branch ran), a value the step computes (a
# `$(...)`, a shell local: only a line showing it proves it), or a line its step can skip and still exit 0.


def normal_step(text: str) -> str:
    """A RUN instruction as kaniko's history and cache lines quote it (the instruction as written, continuation
    lines joined), whitespace collapsed, with the forms other builders write (`/bin/sh -c`, `|N ARG=..`)
    removed: the form two quotes of one step are compared in."""
    t = " ".join(text.split())
    t = re.sub(r"^RUN ", "", t)
    t = re.sub(r"^\|\d+ (?:\S+=\S* )*", "", t)
    t = re.sub(r"^/bin/sh -c ", "", t)
    return re.sub(r" # buildkit$", "", t)


def step_key(step: str) -> str:
    """A short, exact key of a RUN step (``Marker.step_key``): sha256 of ``normal_step``, 16 hex digits."""
    return hashlib.sha256(normal_step(step).encode()).hexdigest()[:16]


_CACHE_CMD = re.compile(re.escape("Using caching version of cmd: ") + r"(RUN .*?)(?:\x1b\[[0-9;]*m)*\s*$")


def cache_hits(log_text: str) -> dict[str, str]:
    """The RUN steps kaniko took from its cache, from its own lines: step key -> the step as quoted."""
    out: dict[str, str] = {}
    for line in log_text.splitlines():
        if CACHE_HIT in line and (hit := _CACHE_CMD.search(line)):
            out.setdefault(step_key(hit.group(1)), hit.group(1).strip())
    return out


def cache_hit_of(m: Marker, hits: dict[str, str]) -> str | None:
    """The cache line of ``m``'s own step (exactly its RUN instruction, by ``step_key``), or None. A hit of any
    other step (another variant's text, a step that merely holds the echo) is not this marker's."""
    if m.role != "assert" or not m.step_key or m.source in ("script", "kaniko"):
        return None
    return hits.get(m.step_key)


def cache_proves_line(m: Marker, traced: dict[str, str] | None = None) -> str | None:
    """None where a cache hit of ``m``'s step proves its line was printed (see the section comment above), else
    why not. Proven: an unguarded echo of the step's final `&&` chain (``must_run``: the step exited 0, so it
    printed), with fixed text, or with values that are ARGs of the step's cache key with the planned values
    (``cache_proof``: the same key cannot hold other values), or in the final chain of an `if` branch whose
    tests read only such keyed values (``cache_proof`` of a conditional marker: those values chose it). Where the
    log shows the kaniko command the script ran (``traced``), it must pass those args with the planned values:
    the key of this job's hit holds what kaniko was given, which the plan only expects."""
    if m.conditional and not m.cache_proof:
        return ("it is printed on a branch of its step, and the service cannot tell from the step's cache key "
                "that the branch ran (its test reads something other than a build arg of the key with the planned "
                "value, or the echo is not in the final `&&` chain of a branch ending the step)")
    if m.pattern is not None:
        vals = ", ".join(f"{k}={v}" for k, v in m.values.items())
        return ("its text holds a value the step computes (a `$(...)` or shell variable)"
                + (f" besides {vals}" if vals else "") + ": only a line showing it proves it")
    if not m.must_run and not (m.conditional and m.cache_proof):
        return ("its step can exit 0 without printing it, as far as the service reads the step (it is not an "
                "unguarded `echo` of the step's final `&&` chain)")
    if m.values and not m.cache_proof:
        vals = ", ".join(f"{k}={v}" for k, v in m.values.items())
        return (f"it carries a value ({vals}) that is not a build arg of the step's cache key with the planned "
                "value")
    if m.cache_proof and traced is not None:
        other = [k for k, want in m.cache_vars.items() if k in traced and traced[k] != want]
        if other:
            return (f"the log's traced kaniko command passes {', '.join(f'{k}={traced[k]}' for k in other)} where "
                    f"the plan says {', '.join(f'{k}={m.cache_vars[k]}' for k in other)}: the hit is of a step run "
                    "on those values")
    return None


_TRACED = re.compile(r"^(?:\[[^\]\n]*\] )?\++ (.*--build-arg.*)$")


def traced_build_args(log_text: str) -> dict[str, str] | None:
    """The `--build-arg NAME=VALUE` pairs of the last kaniko command the build script's xtrace (`set -x`, both
    MarinSkyRL eras and the fixture) shows in the log: what kaniko was actually given. None where the log shows
    none (a script without xtrace, or a log that lost the line). A line that does not split as shell words
    is left out, never guessed."""
    import shlex

    last: dict[str, str] | None = None
    for line in log_text.splitlines():
        hit = _TRACED.match(line)
        if not hit:
            continue
        try:
            words = shlex.split(hit.group(1))
        except ValueError:
            continue
        if not any(w == "--destination" or w.startswith("--destination=") for w in words):
            continue  # not an image build
        pairs: dict[str, str] = {}
        for i, w in enumerate(words):
            arg = words[i + 1] if w == "--build-arg" and i + 1 < len(words) else (
                w.removeprefix("--build-arg=") if w.startswith("--build-arg=") else None)
            if arg is not None and "=" in arg:
                k, _, v = arg.partition("=")
                pairs[k] = v
        last = pairs
    return last


def cache_unproven_reason(m: Marker, step: str | None, why: str) -> str:
    """The reason a target shows for a marker its cached step cannot prove: where the step is, and why."""
    step = " ".join(step.split()) if step else ""
    quoted = "" if not step else f", `{step if len(step) <= 100 else step[:97] + '...'}`"
    return f"unproven (kaniko took its step from the cache: {m.source}:{m.line}{quoted}): {why}"


def _contradictions(markers: list[Marker], own: str, numbers: list[int]) -> list[str]:
    asserts = [m for m in markers if m.role == "assert"]
    lines = own.split("\n") if own else []
    out: list[str] = []
    seen: set[int] = set()

    def planned_line(line: str) -> bool:
        return any(m.search(line) for m in asserts)

    def where(m: Marker) -> str:
        vals = ", ".join(f"{k}={v}" for k, v in m.values.items())
        return f"{m.source}:{m.line}" + (f", planned {vals}" if vals else "")

    starts = [0]
    for line in lines[:-1]:
        starts.append(starts[-1] + len(line) + 1)

    def index_of(pos: int) -> int:
        return bisect.bisect_right(starts, pos) - 1

    for m in asserts:
        checks: list[tuple[re.Pattern[str], str]] = []
        if m.shape:
            checks.append((re.compile(m.shape, re.M), "shows it with another value"))
        for x in m.excludes:
            checks.append((re.compile(re.escape(x), re.M), "is the branch the plan excludes"))
        for rx, what in checks:
            for hit in rx.finditer(own):
                i = index_of(hit.start())
                if i in seen:
                    continue
                line = lines[i]
                if m.search(line) or planned_line(line):
                    continue
                seen.add(i)
                shown = _STORE_PREFIX.sub("", line).strip()[:300]
                out.append(f"log line {numbers[i]}: `{shown}` {what}: the plan expects "
                           f"`{m.name}` ({where(m)})")
                if len(out) >= 10:
                    return out
    return out


CACHE_HIT = "Using caching version of cmd: RUN"
