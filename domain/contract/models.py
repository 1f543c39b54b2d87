"""Pydantic models of the build contract read from a MarinSkyRL commit.

Why models: the orchestrator plans jobs, checks logs and validates images only from these values, so
every fact the upstream files state (required variables, arch defaults, launch flags, layer ceiling)
is a named field here, never a constant in Python.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Literal

from pydantic import BaseModel, Field

# ----------------------------------------------------------------------------- shell conditions


class Condition(BaseModel):
    """One test from a shell `if`/`&&`/`case`: `"$VAR" = value`, `!= value`, `-n "$VAR"`, `-z "$VAR"`.

    ``default`` is the `${VAR:-default}` the test itself supplies for an unset or empty VAR.
    """

    var: str
    op: Literal["=", "!=", "-n", "-z"]
    value: str = ""
    default: str | None = None

    def holds(self, env: Mapping[str, str]) -> bool | None:
        """True/False, or None when ``var`` is not known."""
        v = env.get(self.var)
        if (v is None or v == "") and self.default is not None:
            v = self.default
        if v is None:
            return None
        if self.op == "-n":
            return v != ""
        if self.op == "-z":
            return v == ""
        equal = v == self.value
        return equal if self.op == "=" else not equal

    def negated(self) -> Condition:
        flip = {"=": "!=", "!=": "=", "-n": "-z", "-z": "-n"}[self.op]
        return self.model_copy(update={"op": flip})

    def __str__(self) -> str:
        if self.op == "-n":
            return f"{self.var} non-empty"
        if self.op == "-z":
            return f"{self.var} empty"
        return f"{self.var}{self.op}{self.value}"


class Guard(BaseModel):
    """A branch condition: ``all_of`` (a conjunction), or ``any_of`` (`||` of conjunctions) when set;
    negated for an `else` branch; ``opaque`` holds a test that is not decidable from variables.
    ``text`` is the test as written (shown to operators)."""

    all_of: list[Condition] = Field(default_factory=list)
    any_of: list[list[Condition]] = Field(default_factory=list)
    negated: bool = False
    opaque: str | None = None
    text: str | None = None

    @classmethod
    def from_dnf(cls, dnf: list[list[Condition]], text: str | None = None) -> Guard:
        if len(dnf) == 1:
            return cls(all_of=dnf[0], text=text)
        return cls(any_of=dnf, text=text)

    def dnf(self) -> list[list[Condition]]:
        return self.any_of if self.any_of else [self.all_of]

    def holds(self, env: Mapping[str, str]) -> bool | None:
        if self.opaque is not None:
            return None
        clauses: list[bool | None] = []
        for clause in self.dnf():
            results = [c.holds(env) for c in clause]
            clauses.append(False if False in results else (None if None in results else True))
        value = True if True in clauses else (None if None in clauses else False)
        if value is None:
            return None
        return (not value) if self.negated else value

    def __str__(self) -> str:
        if self.opaque is not None:
            return self.opaque
        clauses = [" and ".join(map(str, c)) for c in self.dnf()]
        body = clauses[0] if len(clauses) == 1 else " or ".join(f"({c})" if " and " in c else c for c in clauses)
        return f"not ({body})" if self.negated else body


def guards_hold(guards: list[Guard], env: Mapping[str, str]) -> bool | None:
    """True when every guard holds, False when one fails, None when one cannot be decided."""
    undecided = False
    for g in guards:
        r = g.holds(env)
        if r is False:
            return False
        if r is None:
            undecided = True
    return None if undecided else True


# ----------------------------------------------------------------------------- build script


class RequiredVar(BaseModel):
    """A `: "${VAR:?...}"` abort; ``when`` (all must hold) empty means always required."""

    name: str
    when: list[Guard] = Field(default_factory=list)
    line: int

    @property
    def always(self) -> bool:
        return not self.when

    @property
    def condition(self) -> str:
        """The condition as a readable expression ("always" when unconditional)."""
        return " and ".join(str(g) for g in self.when) if self.when else "always"


class Knob(BaseModel):
    """An optional input `LOCAL="${ENV:-default}"`; ``default`` is the raw shell text."""

    env: str
    local: str
    default: str
    line: int


class ArchSpec(BaseModel):
    """One arm of the script's `uname -m` case table, interpreted for what the service needs.

    ``settings`` is the whole arm (every assignment, raw); ``lines`` records the source line of each
    interpreted field (and of each setting) for `file:line` provenance.
    """

    arch: str  # kaniko arch: "amd64", "arm64" (from linux/<arch>)
    uname: str  # "x86_64", "aarch64"
    dockerfile: str
    kaniko_platform: str  # "linux/amd64"
    manifest_platform: str | None = None  # wheel MANIFEST platform, "linux_x86_64"
    crane_asset: str | None = None
    tag_suffix: str  # "" or "-arm64"
    cache_name: str | None = None  # "cache" / "cache-arm64" (the cache repo below the image repository)
    cache_repo: str | None = None  # template with {repository}: "{repository}/cache"
    default_wheel_source: str
    line: int
    settings: dict[str, str] = Field(default_factory=dict)  # shell var -> value, as the arm assigns it
    lines: dict[str, int] = Field(default_factory=dict)  # field or shell var -> source line
    # How the Dockerfile was chosen: "arch table", "script default" or "naming convention" (see why).
    dockerfile_origin: str = "arch table"
    dockerfile_why: str | None = None
    # Set when the script's own default would pick the wrong Dockerfile on this host: the service passes
    # ``dockerfile`` explicitly as this env variable of the job.
    dockerfile_env: str | None = None
    # Set when this architecture cannot be built from this commit (the reason names file:line).
    blocked: str | None = None


class ConditionalPin(BaseModel):
    name: str
    when: list[Guard]
    line: int = 0


class ScriptContract(BaseModel):
    path: str
    required: list[RequiredVar]
    credential_user_var: str | None
    credential_token_var: str
    arch_var: str  # the variable set from `uname -m` (BUILD_ARCH; fixture HOST_ARCH); "" without a table
    uname_override_var: str | None = None  # SANDBOX_UNAME_M (sandbox only)
    task_guard_var: str | None = None  # IRIS_TASK_ID
    arches: dict[str, ArchSpec]  # keyed by kaniko arch
    pinned_args: list[str]
    conditional_pinned_args: list[ConditionalPin] = Field(default_factory=list)
    wheel_source_var: str
    wheel_sources: list[str]
    artifact_uri_schemes: list[str] = Field(default_factory=list)  # ["s3://", "file://"]
    knobs: dict[str, Knob]  # keyed by env name
    image_repository_var: str  # GHCR_IMAGE_REPOSITORY (era C: IMAGE_REPOSITORY)
    image_repository_default: str
    repository_local: str  # the shell variable holding the repository (REPO)
    tag_prefix_var: str | None
    megatron_var: str | None
    floating_var: str | None  # PUSH_FLOATING
    preserve_wheels_var: str | None
    dockerfile_var: str | None
    tag_pattern: str  # "${TAG_PREFIX}-${GITSHA}${TAG_SUFFIX}"
    wheels_tag_pattern: str | None
    floating_tag_pattern: str | None
    arch_field_vars: dict[str, str] = Field(default_factory=dict)  # shell var -> ArchSpec field
    locals: dict[str, str] = Field(default_factory=dict)  # other `X="..."` assignments (raw)
    echoes: list[EchoLine] = Field(default_factory=list)  # stdout echo lines (log markers)
    pin_echo: str | None = None  # the pin-loop echo template (e.g. `[pin] $_arg=$_declared (from $DOCKERFILE)`)
    pin_loop_var: str = "pin"  # the loop variable holding the pin name in ``pin_echo``
    pin_value_var: str | None = "value"  # the loop variable holding the declared value
    # Source line per field, for `file:line` provenance: image_repository_default, tag_pattern,
    # wheels_tag_pattern, floating_tag_pattern, cache_repo, pinned_args, credential_user,
    # credential_token, dockerfile, wheel_source, arch_table, arch_var, self_location (where the script
    # finds its own directory: BASH_SOURCE, dirname "$0"; it then needs its siblings beside it)
    # (absent: not in the script).
    lines: dict[str, int] = Field(default_factory=dict)
    # Where errexit is on: [(set -e line, set +e line or None)] (domain/contract/script.py _errexit_spans).
    errexit_spans: list[tuple[int, int | None]] = Field(default_factory=list)
    # What it passes to kaniko as `--build-arg NAME=VALUE` (name -> value as written; a build arg overrides a
    # stage's ARG default); None: a `--build-arg` whose name the text does not spell (any default may be overridden).
    build_args: dict[str, str] | None = None

    @property
    def always_required(self) -> list[str]:
        return [r.name for r in self.required if r.always]

    def required_when(self, env: Mapping[str, str]) -> list[str]:
        """Variables the script aborts without, given the job env (conditions decided by ``env``).

        A variable the job does not set holds its knob default (`HF_WHEEL_REPOSITORY="${...:-}"` is
        empty), so a condition on it is decided rather than assumed."""
        values = {k.local: k.default for k in self.knobs.values() if "$" not in k.default}
        values.update({k.env: k.default for k in self.knobs.values() if "$" not in k.default})
        for k in self.knobs.values():
            if k.env in env:
                values[k.local] = env[k.env]
        values.update(env)
        out: list[str] = []
        for r in self.required:
            if all(g.holds(values) is not False for g in r.when) and r.name not in out:
                out.append(r.name)
        return out

    def knob_default(self, env_name: str) -> str | None:
        k = self.knobs.get(env_name)
        return k.default if k else None


# ----------------------------------------------------------------------------- Dockerfile


class EchoLine(BaseModel):
    """An `echo` that prints a log marker; ``template`` is raw shell text (may hold $VARS)."""

    template: str
    guards: list[Guard] = Field(default_factory=list)
    in_loop: bool = False
    stage: str | None = None
    line: int
    source_text: str | None = None  # as written in the file (what a kaniko cache-hit line quotes)
    step: str | None = None  # a Dockerfile echo: its whole RUN instruction as written (what kaniko's history records)
    must_run: bool = False  # an `echo` a zero exit of its RUN step proves ran (its final `&&` chain, unguarded)
    # An `echo` of a final `&&` chain of an `if` branch that is the step's final statement: a zero exit of the step
    # proves it ran where these conditions held (the branch's test, earlier tests negated). None: no such proof.
    runs_when: list[Guard] | None = None
    # Printed by a `python -c` of a RUN step that only tests and prints: running the step again in the image
    # proves what the image answers (an echo of a variable would only repeat the value it is given).
    check_step: bool = False
    only_step: bool = False  # exactly one RUN instruction of the file holds its text (a cache-hit line is its step's)


class CopyStep(BaseModel):
    """A COPY/ADD: its sources (as written, may hold $VARS) and where they come from (the build context, or
    ``from_`` a stage or image). Why kept: a source missing from the context fails kaniko after submission."""

    instruction: str  # COPY | ADD
    sources: list[str]
    from_: str | None = None  # --from=<stage, index or image>
    line: int
    env: dict[str, str] = Field(default_factory=dict)  # the stage's ENV values in force at this step (raw)


class Stage(BaseModel):
    name: str
    base: str  # an image reference or another stage's name
    base_is_stage: bool
    line: int
    platform: str | None = None  # `FROM --platform=<value>` as written (may hold $ARGs)
    args: dict[str, str | None] = Field(default_factory=dict)  # ARGs declared in the stage
    labels: dict[str, str] = Field(default_factory=dict)  # raw templates
    layer_steps: int = 0  # RUN / COPY / ADD instructions
    echoes: list[EchoLine] = Field(default_factory=list)
    copies: list[CopyStep] = Field(default_factory=list)
    # Where the stage declares each ARG (its last `ARG X` line) and first sets each ENV key: a kaniko cache hit
    # proves a value its step printed only for an ARG in force there that no ENV overrides (domain/markers.py).
    arg_lines: dict[str, int] = Field(default_factory=dict)
    env_lines: dict[str, int] = Field(default_factory=dict)


class DockerfileContract(BaseModel):
    path: str
    pins: dict[str, str]  # global `ARG X=default`
    global_args: dict[str, str | None]
    stages: list[Stage]
    pin_lines: dict[str, int] = Field(default_factory=dict)  # pin -> source line

    def stage(self, name: str) -> Stage:
        for s in self.stages:
            if s.name == name:
                return s
        raise KeyError(name)

    @property
    def final_stage(self) -> Stage:
        return self.stages[-1]

    def chain(self, target: str | None = None) -> list[Stage]:
        """The stages ``target`` (default: last) derives from, base first."""
        stage = self.stage(target) if target else self.final_stage
        out = [stage]
        while stage.base_is_stage:
            stage = self.stage(stage.base)
            out.append(stage)
        return list(reversed(out))

    def labels(self, target: str | None = None) -> dict[str, str]:
        merged: dict[str, str] = {}
        for s in self.chain(target):
            merged.update(s.labels)
        return merged

    def layer_steps(self, target: str | None = None) -> int:
        return sum(s.layer_steps for s in self.chain(target))


# ----------------------------------------------------------------------------- ops doc


class EnvPair(BaseModel):
    name: str
    value: str  # raw: "$GITSHA" (a reference) or a literal like "wheel-builder"
    line: int = 0  # where the prose states it (0: configuration)

    @property
    def is_reference(self) -> bool:
        return bool(re.fullmatch(r"\$\{?[A-Za-z_][A-Za-z0-9_]*\}?", self.value))


class LaunchTemplate(BaseModel):
    """`iris job run` flags the ops doc states for one architecture ("*": every job); None = not stated."""

    arch: str
    cluster: str | None = None
    line: int
    task_image: str | None = None
    no_sync: bool | None = None
    enable_extra_resources: bool | None = None
    no_wait: bool | None = None
    job_name: str | None = None  # raw template, e.g. "gpurl-kaniko-amd64-${VARIANT}-${SHORT_SHA}"
    cpu: float | None = None
    memory: str | None = None  # raw, e.g. "512GB"
    disk: str | None = None
    gpu: str | None = None
    priority: str | None = None
    max_retries: int | None = None
    timeout_s: int | None = None
    preemptible: bool | None = None
    flags: dict[str, str | bool] = Field(default_factory=dict)  # every flag as written
    env: list[EnvPair] = Field(default_factory=list)
    command: list[str] = Field(default_factory=list)  # argv after `--`
    lines: dict[str, int] = Field(default_factory=dict)  # field name -> line it was read from


class Placement(BaseModel):
    arch: str
    cluster: str
    priority: str | None = None
    line: int
    tag_forms: list[str] = Field(default_factory=list)  # as the doc writes them: "gpu-rl-<sha>-arm64"


class LayerCeiling(BaseModel):
    max_layer_bytes: int  # every compressed layer strictly below
    warn_layer_bytes: int  # flag layers above
    min_layers: int


class ProseCeiling(BaseModel):
    """The layer ceiling as far as the prose states it (a table or a sentence); None = not stated."""

    max_layer_bytes: int | None = None
    warn_layer_bytes: int | None = None
    min_layers: int | None = None
    lines: dict[str, int] = Field(default_factory=dict)


class DeployRule(BaseModel):
    glob: str
    rebuild: bool
    reaches: str
    line: int
    source: str = ""  # "file:line" or "config:<key>" (filled when the contract is resolved)


class WheelArtifact(BaseModel):
    uri: str | None
    sha256: str | None
    manifest_platform: str | None
    stated_usable: bool
    usable: bool  # stated usable AND full SHA AND known scheme
    reason: str
    line: int


class ContractRow(BaseModel):
    """A row of the ops build-contract table."""

    variable: str
    required_when: str  # raw
    source: str = ""
    always: bool = False
    when: list[Condition] = Field(default_factory=list)
    optional_default: str | None = None
    understood: bool = True  # False: the condition is prose the parser cannot compare with the script
    line: int


class OpsContract(BaseModel):
    """What the ops doc states; every part may be absent (the configuration then supplies it)."""

    path: str
    found: bool = True  # False: no ops doc at the commit
    deploy_boundary: list[DeployRule] = Field(default_factory=list)
    contract_rows: list[ContractRow] = Field(default_factory=list)
    placements: dict[str, Placement] = Field(default_factory=dict)
    templates: dict[str, LaunchTemplate] = Field(default_factory=dict)  # per arch, plus "*" for every job
    megatron_env: list[EnvPair] = Field(default_factory=list)
    layer_ceiling: ProseCeiling = Field(default_factory=ProseCeiling)
    wheel_artifact: WheelArtifact | None = None
    skipped: list[str] = Field(default_factory=list)  # "line N: why" for prose the parser did not use


# ----------------------------------------------------------------------------- resolved plan inputs


class ArchLaunch(BaseModel):
    """Everything one architecture's jobs are launched with, each field from prose or configuration."""

    arch: str
    cluster: str
    priority: str
    cpu: float
    memory: str
    disk: str
    gpu: str | None
    max_retries: int
    timeout_s: int
    task_image: str | None
    no_sync: bool
    enable_extra_resources: bool
    job_name: str | None
    env: list[EnvPair]
    command: list[str]
    script_env_var: str | None  # the `-e` variable that carries the base64 build script to the command
    provenance: dict[str, str]  # field (or "env.NAME") -> "file:line" or "config:<key>"


# ----------------------------------------------------------------------------- AGENTS.md


class PolicyLine(BaseModel):
    text: str
    line: int


class AgentsPolicy(BaseModel):
    path: str
    policy: list[PolicyLine]
    do_not_touch: list[str] = Field(default_factory=list)  # paths named in "Do not add/edit ..." lines


# ----------------------------------------------------------------------------- whole contract


class Disagreement(BaseModel):
    file: str
    field: str
    prose_value: str
    script_value: str  # or the configuration value when ``against`` is "configuration"
    resolution: str
    against: Literal["script", "configuration"] = "script"
    prose_source: str = ""  # "file:line" of the prose value
    other_source: str = ""  # "file:line" in the script, or "config:<key>"


class Fallback(BaseModel):
    """A planned value the prose did not give, taken from the configuration instead."""

    field: str
    config_key: str
    reason: str


class BuildContract(BaseModel):
    commit: str
    script: ScriptContract
    dockerfiles: dict[str, DockerfileContract]
    ops: OpsContract
    agents: AgentsPolicy
    disagreements: list[Disagreement] = Field(default_factory=list)
    ops_text: str = ""  # kept so a corrected ops doc can be proposed
    # Resolved from prose with configuration fallback (domain.contract.resolve):
    launch: dict[str, ArchLaunch] = Field(default_factory=dict)  # keyed by arch
    megatron_env: list[EnvPair] = Field(default_factory=list)
    layer_ceiling: LayerCeiling | None = None
    deploy_boundary: list[DeployRule] = Field(default_factory=list)
    provenance: dict[str, str] = Field(default_factory=dict)  # contract-wide fields -> source
    fallbacks: list[Fallback] = Field(default_factory=list)

    def arch(self, arch: str) -> ArchSpec:
        try:
            return self.script.arches[arch]
        except KeyError:
            known = ", ".join(sorted(self.script.arches))
            raise ContractError(self.script.path, 0, f"an architecture in ({known})", arch) from None

    def dockerfile_for(self, arch: str) -> DockerfileContract:
        return self.dockerfiles[self.arch(arch).dockerfile]


from domain.contract.errors import ContractError  # noqa: E402  (used by BuildContract.arch)

ScriptContract.model_rebuild()
