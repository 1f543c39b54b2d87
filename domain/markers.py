"""Assertion markers a successful build log must show, derived from the contract at the build commit.

Why derived: the markers are whatever the script and the Dockerfile's RUN steps echo on the path this
(arch, variant, wheel source) takes, plus kaniko's final push. Reading them from the files means a
Dockerfile that adds or drops an assertion changes the check with it; nothing is hard-coded here
except kaniko's push lines.
"""

from __future__ import annotations

import re
from typing import Literal

from pydantic import BaseModel

from domain.contract import BuildContract, EchoLine
from domain.contract.models import guards_hold
from domain.contract.script import errexit_covers, shell_values

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

    def search(self, log: str, start: int = 0) -> re.Match[str] | None:
        rx = self.pattern if self.pattern is not None else re.escape(self.text or "")
        return re.compile(rx, re.M).search(log, start)


class MarkerCheck(BaseModel):
    found: list[str]
    missing: list[str]
    cached: list[str] = []  # satisfied by kaniko reusing the cached layer of the step that prints them
    final_push_seen: bool
    pushed_digest: str | None  # "sha256:<64 hex>" of the final push


def _to_marker(template: str, env: dict[str, str], source: str, source_text: str | None = None) -> Marker:
    """Resolve known variables; anything else (a shell local, `$(...)`) becomes a wildcard."""
    literal: list[str] = []
    regex: list[str] = []
    wild = False
    pos = 0
    for m in _PART.finditer(template):
        lit = template[pos:m.start()]
        literal.append(lit)
        regex.append(re.escape(lit))
        pos = m.end()
        name = m.group(1) or m.group(3)
        default = m.group(2)
        if name and name in env and (env[name] != "" or default is None):
            literal.append(env[name])
            regex.append(re.escape(env[name]))
        elif name and default is not None and name in env:
            literal.append(default)
            regex.append(re.escape(default))
        else:
            wild = True
            literal.append("…")
            regex.append(r"\S.*?")
    literal.append(template[pos:])
    regex.append(re.escape(template[pos:]))
    name = "".join(literal).strip()
    if wild:
        return Marker(name=name, pattern="".join(regex), source=source, template=source_text or template)
    return Marker(name=name, text="".join(literal), source=source, template=source_text or template)


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
    markers.extend(_echo_markers(s.echoes, cond_env, values, "script"))
    for m in markers:  # the script's: under errexit (as bash reads it) the final push proves they ran
        if m.line and errexit_covers(s.errexit_spans, m.line):
            m.image_proof = "script"

    # Dockerfile: the final target's stage chain with its build args.
    build_env = dict(df.pins)
    for stage in df.chain():
        build_env.update({k: v for k, v in stage.args.items() if v is not None})
    build_env.update({"GITSHA": contract.commit, s.wheel_source_var: wheel_source})
    if s.megatron_var:
        build_env[s.megatron_var] = values.get(s.knobs[s.megatron_var].local, "0")
    for stage in df.chain():
        markers.extend(_echo_markers(stage.echoes, build_env, build_env, df.path))

    # kaniko's final push of this tag (the wheels push has another tag and does not count).
    markers.append(Marker(name=f"push {repo}:{tag}", text=f"Pushing image to {repo}:{tag}",
                          source="kaniko", role="push"))
    markers.append(Marker(name=f"pushed {repo}@sha256", pattern=re.escape(f"Pushed {repo}@") + DIGEST_RE,
                          source="kaniko", role="pushed"))
    seen: dict[str, int] = {}
    for m in markers:
        n = seen.get(m.name, 0)
        seen[m.name] = n + 1
        if n:
            m.name = f"{m.name} #{n + 1}"
    return markers


def _echo_markers(echoes: list[EchoLine], cond_env: dict[str, str], values: dict[str, str],
                  source: str) -> list[Marker]:
    out = []
    for e in echoes:
        if e.in_loop or guards_hold(e.guards, cond_env) is not True:
            continue
        m = _to_marker(e.template, values, source, e.source_text)
        m.line = e.line
        out.append(m)
    return out


def check_log(markers: list[Marker], log_text: str) -> MarkerCheck:
    """Which markers the log shows; the final push counts only as `Pushing image to` then `Pushed`."""
    found: list[str] = []
    missing: list[str] = []
    push_end: int | None = None
    digest: str | None = None
    cache_hits = [line for line in log_text.splitlines() if CACHE_HIT in line]
    cached: list[str] = []
    for m in markers:
        if m.role == "assert":
            if m.search(log_text) and not _only_in_cache_lines(m, log_text):
                found.append(m.name)
            elif m.template and any(m.template in line for line in cache_hits):
                # kaniko skipped the step: its layer, built earlier from identical inputs (same cache
                # key), already printed this marker; the log proves the reuse, so the assertion holds.
                cached.append(m.name)
            else:
                missing.append(m.name)
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
    return MarkerCheck(found=found, missing=missing, cached=cached, final_push_seen=digest is not None,
                       pushed_digest=digest)


CACHE_HIT = "Using caching version of cmd: RUN"


def _only_in_cache_lines(m: Marker, log_text: str) -> bool:
    """True when every sighting of the marker is inside a cache-hit line (the echo's source text)."""
    return all(CACHE_HIT in line for line in log_text.splitlines() if m.search(line))
