"""Plan the build set: one Iris job per (architecture, variant), every value taken from the contract.

Why pure: the plan is shown to the operator (plan mode) and recorded in workflow history before any
job exists; it must be reproducible from the commit's files plus the request and live cluster state.
"""

from __future__ import annotations

import re
from typing import Literal

from pydantic import BaseModel

from domain.contract import BuildContract, LayerCeiling, render
from domain.contract.reconcile import credential_renames, script_inputs
from domain.markers import Marker, expected_markers, variant_env
from domain.request import VARIANTS, BuildRequest, CompatibilityRequest  # noqa: F401 - re-exported
from rehearsal.result import RehearsalResult

# Iris priority bands and the CLI's memory units (the reference client reads "GB" as GiB).
PRIORITY_BANDS = ("production", "interactive", "batch")
IRIS_CLI_PREEMPTION_RETRIES = 1000  # what `iris job run` sends for max_retries_preemption
_MEM_UNITS = {"": 1, "B": 1, "K": 2**10, "KB": 2**10, "KIB": 2**10, "M": 2**20, "MB": 2**20, "MIB": 2**20,
              "G": 2**30, "GB": 2**30, "GIB": 2**30, "T": 2**40, "TB": 2**40, "TIB": 2**40}


class BuildSetError(ValueError):
    """The request cannot be planned against this contract; the message names the offending value."""


class JobResources(BaseModel):
    cpu: float
    memory_bytes: int
    disk_bytes: int
    gpu: str | None


class EnvVar(BaseModel):
    name: str
    value: str | None = None
    secret: Literal["registry_user", "registry_token"] | None = None


class JobSpecPlan(BaseModel):
    job_name: str
    cluster: str
    priority: str
    resources: JobResources
    max_retries_failure: int
    max_retries_preemption: int
    timeout_s: int
    task_image: str | None
    no_sync: bool
    enable_extra_resources: bool
    env: list[EnvVar]
    command: list[str]
    script_env_var: str | None
    script_path: str


class TargetSpec(BaseModel):
    architecture: str
    variant: str
    cluster: str
    dockerfile: str
    kaniko_platform: str
    image_repository: str
    tag: str
    floating_tag: str | None
    wheel_source: str
    expected_markers: list[Marker]
    job: JobSpecPlan
    layer_ceiling: LayerCeiling | None = None
    # The commit every cited file:line refers to (the base commit until the build commit is pushed).
    lines_at: str | None = None
    cache_repo: str | None = None  # the kaniko cache repository the script derives for this architecture
    # The planned command run in an isolated root before anything is submitted (rehearsal/model.py).
    rehearsal: RehearsalResult | None = None
    allow_suspicious_files: bool = False  # the request's --allow-suspicious-files, for the submit's bundle
    # Where each planned value came from: field -> "file:line" (at the build commit), "config:<key>"
    # or "flag:<option>" (the operator's request). Fields: cluster, priority, resources.*, max_retries,
    # timeout, task_image, command, env.NAME, dockerfile, tag, image_repository, wheel_source, markers,
    # layer_ceiling.*.
    provenance: dict[str, str] = {}

    @property
    def key(self) -> str:
        return f"{self.architecture}-{self.variant}"


def parse_iris_size(value: str) -> int:
    """A size with its unit, as `iris job run` reads it ("512GB" is 512 GiB). A bare number or a space
    before the unit is refused: "512 GB" from prose once planned 512 bytes."""
    m = re.fullmatch(r"([0-9]+(?:\.[0-9]+)?)([A-Za-z]+)", (value or "").strip())
    if not m or m.group(2).upper() not in _MEM_UNITS:
        raise BuildSetError(f"unrecognized size {value!r} (expected a number and a unit, e.g. 512GB)")
    return int(float(m.group(1)) * _MEM_UNITS[m.group(2).upper()])


def _size(value: str, source: str, flag: str) -> int:
    try:
        return parse_iris_size(value)
    except BuildSetError as e:
        raise BuildSetError(f"{source}: {flag} {e}") from None


def choose_wheel_source(contract: BuildContract, arch: str) -> str:
    """The arch default, but prebuilt only with a usable recorded artifact for this platform."""
    a = contract.arch(arch)
    s = contract.script
    source = a.default_wheel_source
    art = contract.ops.wheel_artifact
    if source == "prebuilt-wheelhouse":
        df = contract.dockerfiles[a.dockerfile]
        env = {s.wheel_source_var: source}
        pins_ok = all(p.name in df.pins for p in s.conditional_pinned_args
                      if all(c.holds(env) for c in p.when))
        if not (art and art.usable and art.manifest_platform == a.manifest_platform and pins_ok):
            source = "wheel-builder"
    if source not in s.wheel_sources:
        raise BuildSetError(f"wheel source {source!r} for {arch} is not one the script accepts ({s.wheel_sources})")
    return source


def _at(path: str, line: int | None) -> str:
    return f"{path}:{line}" if line else path


def _job_name(template: str | None, contract: BuildContract, arch: str, variant: str, commit: str) -> str:
    m = re.search(r"SHORT_SHA=\$\{GITSHA:0:(\d+)\}", contract.ops_text)
    short = commit[: int(m.group(1)) if m else 8]
    values = {"VARIANT": variant, "SHORT_SHA": short, "ARCH": arch, "GITSHA": commit}
    name = ""
    if template:
        try:
            name = render(template, values)
        except KeyError as e:
            raise BuildSetError(f"job name template {template!r} uses unknown variable {e.args[0]}") from None
    name = re.sub(r"[^a-z0-9-]+", "-", name.lower()).strip("-")
    for part in (arch, variant, short):
        if part not in name:
            name = f"{name}-{part}" if name else part
    name = re.sub(r"-{2,}", "-", name)
    if len(name) > 63:
        tail = f"-{arch}-{variant}-{short}"
        name = name[: 63 - len(tail)].rstrip("-") + tail
    return name[:63]


def plan_targets(
    contract: BuildContract,
    request: BuildRequest,
    *,
    build_commit: str,
    harbor_commit: str,
    cluster_archs: dict[str, str] | None,
    image_repository_override: str | None,
    registry_host: str | None = None,
) -> list[TargetSpec]:
    """The targets of ``request``. ``registry_host``: the host the registry credential is bound to
    (of ``registry.image_repository``); every destination the job pushes to with it must be there."""
    if request.compatibility_request is None:
        raise BuildSetError(
            "refusing to plan: no explicit compatibility request (image builds are legacy, "
            "marin-community/marin#7920); say who needs the image and why")
    if build_commit != contract.commit:
        raise BuildSetError(f"build commit {build_commit} is not the commit the contract was read at "
                            f"({contract.commit})")
    if not request.architectures:
        raise BuildSetError("no architectures requested")
    s = contract.script
    for arch in request.architectures:
        if arch not in s.arches:
            raise BuildSetError(f"unknown architecture {arch!r} (the build script supports "
                                f"{', '.join(sorted(s.arches))})")
        if s.arches[arch].blocked:
            raise BuildSetError(f"cannot build {arch}: {s.arches[arch].blocked}")
    for variant in request.variants:
        if variant not in VARIANTS:
            raise BuildSetError(f"unknown variant {variant!r} (expected one of {', '.join(VARIANTS)})")
    if "megatron" in request.variants and not contract.megatron_env:
        raise BuildSetError("neither the ops doc nor config build.megatron_env gives the Megatron add-on env")
    for arch in request.clusters:
        if arch not in request.architectures:
            raise BuildSetError(f"cluster override for {arch!r}, which is not a requested architecture")
    repository = image_repository_override or s.image_repository_default
    if registry_host is not None:
        check_credential_destinations(contract, repository, image_repository_override, registry_host,
                                      request.architectures)

    targets: list[TargetSpec] = []
    for arch in request.architectures:
        a = s.arches[arch]
        df = contract.dockerfiles[a.dockerfile]
        pinned_harbor = df.pins.get("HARBOR_COMMIT")
        if pinned_harbor is not None and pinned_harbor != harbor_commit:
            raise BuildSetError(f"{a.dockerfile} pins HARBOR_COMMIT={pinned_harbor}, not {harbor_commit}: "
                                "commit the pin change and build that commit")
        launch = contract.launch.get(arch)
        if launch is None:
            raise BuildSetError(f"no launch values for {arch}: {contract.ops.path} states none and config "
                                f"[build.architectures.{arch}] is not set")
        cluster = request.clusters.get(arch) or launch.cluster
        if cluster_archs is not None and cluster in cluster_archs and cluster_archs[cluster] != arch:
            raise BuildSetError(f"cluster {cluster!r} runs {cluster_archs[cluster]} hosts; {arch} builds "
                                "only on a native host")
        priority = request.priority or launch.priority
        if priority not in PRIORITY_BANDS:
            where = "--priority" if request.priority else launch.provenance.get("priority", "")
            raise BuildSetError(f"unknown priority {priority!r} from {where} (expected one of "
                                f"{', '.join(PRIORITY_BANDS)})")
        wheel_source = choose_wheel_source(contract, arch)
        for variant in request.variants:
            targets.append(_target(contract, request, arch, variant, cluster, priority, wheel_source,
                                   repository, image_repository_override, build_commit, harbor_commit))
    return targets


def _host(image_repository: str) -> str:
    return image_repository.partition("/")[0].lower()


def check_credential_destinations(contract: BuildContract, repository: str, override: str | None,
                                  registry_host: str, architectures: list[str]) -> None:
    """The job gets the registry token and kaniko sends it to every ``--destination`` and ``--cache-repo``
    host: each must be the configured registry host, or the plan is refused naming file:line and host."""
    s = contract.script
    where = "config:registry.image_repository" if override else _at(s.path, s.lines.get("image_repository_default"))
    found: list[str] = []
    if _host(repository) != registry_host.lower():
        found.append(f"{where}: image repository {repository} is on {_host(repository)}")
    for arch in architectures:
        cache = s.arches[arch].cache_repo if arch in s.arches else None
        if cache:
            resolved = cache.replace("{repository}", repository)
            if _host(resolved) != registry_host.lower():
                found.append(f"{_at(s.path, s.lines.get('cache_repo'))}: {arch} cache repository {resolved} is on "
                             f"{_host(resolved)}")
    if found:
        raise BuildSetError(f"refusing to plan: the registry credential is bound to {registry_host} "
                            f"(config:registry.image_repository) but {'; '.join(dict.fromkeys(found))}; "
                            "nothing was pushed or submitted")


def _target(contract, request, arch, variant, cluster, priority, wheel_source, repository, override,
            commit, harbor_commit) -> TargetSpec:
    s = contract.script
    a = s.arches[arch]
    t = contract.launch[arch]
    sp = s.path
    prov: dict[str, str] = {
        "architecture": "flag:--arch", "variant": "flag:--variant",
        "cluster": "flag:--cluster" if request.clusters.get(arch) else t.provenance["cluster"],
        "priority": "flag:--priority" if request.priority else t.provenance["priority"],
        **{f"resources.{k}": t.provenance[k] for k in ("cpu", "memory", "disk", "gpu")},
        "max_retries": t.provenance["max_retries"], "timeout": t.provenance["timeout_s"],
        "task_image": t.provenance["task_image"], "no_sync": t.provenance["no_sync"],
        "enable_extra_resources": t.provenance["enable_extra_resources"], "command": t.provenance["command"],
        "job_name": t.provenance["job_name"],
        "dockerfile": _at(sp, a.lines.get("dockerfile", a.line)) + (
            f" ({a.dockerfile_origin}; passed as {a.dockerfile_env})" if a.dockerfile_env else ""),
        "wheel_source": _at(sp, a.lines.get("default_wheel_source", a.line)),
        "image_repository": "config:registry.image_repository" if override else
        _at(sp, s.lines.get("image_repository_default")),
        "tag": _at(sp, s.lines.get("tag_pattern")),
        "kaniko_platform": _at(sp, a.lines.get("kaniko_platform", a.line)),
        "max_retries_preemption": "service:domain/buildset.py IRIS_CLI_PREEMPTION_RETRIES (what `iris job run` sends)",
        **{k: v for k, v in contract.provenance.items() if k.startswith("layer_ceiling.")},
    }
    script_var = t.script_env_var
    if script_var:
        prov["script_env_var"] = t.provenance.get("script_env_var", t.provenance.get(f"env.{script_var}", ""))
    reads = script_inputs(s)
    renames = credential_renames(s, contract.ops, contract.ops_text)
    inputs: dict[str, tuple[str, str]] = {"GITSHA": (commit, _required_at(s, "GITSHA")),
                                          s.wheel_source_var: (wheel_source, prov["wheel_source"])}
    megatron_src = contract.provenance.get("megatron_env", "")
    inputs.update({k: (v, megatron_src) for k, v in variant_env(contract, variant).items()})
    if request.push_floating and s.floating_var:
        inputs[s.floating_var] = ("1", "flag:--push-floating")
    if override:
        inputs[s.image_repository_var] = (override, "config:registry.image_repository")
    dockerfile_env = a.dockerfile_env
    if dockerfile_env:  # the script's default would pick another Dockerfile on this host: pass it
        inputs[dockerfile_env] = (a.dockerfile, prov["dockerfile"])
    harbor_knob = s.knobs.get(HARBOR_PIN)
    if harbor_knob is not None and HARBOR_PIN not in pins_of(s):
        # The script takes Harbor from the environment (its own default otherwise) and bakes it as a
        # build arg; re-pinning the Dockerfile alone would leave the script's default in the image.
        inputs[HARBOR_PIN] = (harbor_commit, f"{_at(sp, harbor_knob.line)} reads it (default "
                                             f"{harbor_knob.default}); value: the Harbor commit of this build")
    art = contract.ops.wheel_artifact
    if wheel_source == "prebuilt-wheelhouse" and art:
        for r in s.required:
            if r.name.endswith("_URI"):
                inputs[r.name] = (art.uri or "", _at(contract.ops.path, art.line))
            elif r.name.endswith("_SHA256"):
                inputs[r.name] = (art.sha256 or "", _at(contract.ops.path, art.line))

    env: list[EnvVar] = []
    named: set[str] = set()

    def put(name: str, value: str | None = None, secret=None, source: str = "") -> None:
        if source:
            prov[f"env.{name}"] = source
        if name in named:
            for e in env:
                if e.name == name:
                    e.value, e.secret = value, secret
            return
        named.add(name)
        env.append(EnvVar(name=name, value=value, secret=secret))

    pins = pins_of(s)
    for pair in t.env:
        src = t.provenance.get(f"env.{pair.name}", "")
        name = renames.get(pair.name, pair.name)
        if name in pins:
            raise BuildSetError(f"{src}: the {arch} launch passes pin {name} as env; the script refuses pins "
                                "from env")
        if name == s.credential_token_var:
            put(name, secret="registry_token", source=f"{_required_at(s, name)}; value config:registry.token")
        elif name == s.credential_user_var:
            put(name, secret="registry_user", source=f"{_required_at(s, name)}; value config:registry.user")
        elif name == script_var:
            put(name, None, source=src)
        elif name in inputs:
            put(name, inputs[name][0], source=inputs[name][1])
        elif name not in reads:
            continue  # stale prose (reported as a disagreement): the script does not read it
        elif pair.is_reference:
            raise BuildSetError(f"{src}: the {arch} launch passes -e {pair.name} {pair.value}, which the "
                                "service has no value for")
        else:
            put(name, pair.value, source=src)
    for name, (value, src) in inputs.items():
        put(name, value, source=src)
    if s.credential_user_var:
        put(s.credential_user_var, secret="registry_user",
            source=f"{_required_at(s, s.credential_user_var)}; value config:registry.user")
    put(s.credential_token_var, secret="registry_token",
        source=f"{_required_at(s, s.credential_token_var)}; value config:registry.token")

    decide = {e.name: (e.value if e.value is not None else "<set>") for e in env}
    for name in s.required_when(decide):
        if name not in named:
            raise BuildSetError(
                f"{_required_at(s, name)}: requires {name}, which neither the {arch} launch in "
                f"{contract.ops.path} nor the service supplies for {arch}-{variant}; refusing to submit")

    knob_env = {e.name: e.value for e in env if e.value is not None and e.secret is None}
    values = {s.arch_var: a.uname, "GITSHA": commit}
    values.update({var: str(getattr(a, f) or "") for var, f in s.arch_field_vars.items()})
    for k in s.knobs.values():
        try:
            values[k.local] = render(knob_env.get(k.env, k.default), values)
        except KeyError:
            pass
    tag = render(s.tag_pattern, values)
    floating = render(s.floating_tag_pattern, values) if (request.push_floating and s.floating_tag_pattern) else None
    if floating:
        prov["floating_tag"] = f"{_at(sp, s.lines.get('floating_tag_pattern'))}; flag:--push-floating"
    cache_repo = None
    if a.cache_repo:
        cache_repo = a.cache_repo.replace("{repository}", repository)
        cache_override = s.knobs.get("KANIKO_CACHE_REPOSITORY")
        if cache_override and cache_override.env in knob_env:
            cache_repo = knob_env[cache_override.env]
        prov["cache_repo"] = _at(sp, s.lines.get("cache_repo"))
    job = JobSpecPlan(
        job_name=_job_name(t.job_name, contract, arch, variant, commit),
        cluster=cluster,
        priority=priority,
        resources=JobResources(cpu=t.cpu, memory_bytes=_size(t.memory, prov["resources.memory"], "--memory"),
                               disk_bytes=_size(t.disk, prov["resources.disk"], "--disk"), gpu=t.gpu),
        max_retries_failure=t.max_retries,
        max_retries_preemption=IRIS_CLI_PREEMPTION_RETRIES,
        timeout_s=t.timeout_s,
        task_image=t.task_image,
        no_sync=t.no_sync,
        enable_extra_resources=t.enable_extra_resources,
        env=env,
        command=list(t.command),
        script_env_var=script_var,
        script_path=s.path,
    )
    markers = expected_markers(contract, arch, variant, wheel_source, tag,
                               image_repository=repository, job_env=knob_env)
    prov["markers"] = ", ".join(sorted({m.source for m in markers}))
    return TargetSpec(architecture=arch, variant=variant, cluster=cluster, dockerfile=a.dockerfile,
                      kaniko_platform=a.kaniko_platform, image_repository=repository, tag=tag,
                      floating_tag=floating, wheel_source=wheel_source, expected_markers=markers, job=job,
                      layer_ceiling=contract.layer_ceiling, cache_repo=cache_repo, provenance=prov)


HARBOR_PIN = "HARBOR_COMMIT"


def pins_of(s) -> set[str]:
    """The ARGs the script reads out of the Dockerfile (and refuses from the environment)."""
    return set(s.pinned_args) | {p.name for p in s.conditional_pinned_args}


def _required_at(s, name: str) -> str:
    line = next((r.line for r in s.required if r.name == name), 0)
    return _at(s.path, line)
