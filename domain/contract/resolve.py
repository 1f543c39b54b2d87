"""Combine what the ops doc states with the service configuration, and say where each value came from.

Why: the ops doc is prose and may drop, rename or reshape any section; a build must never stop for
that. Each planned launch value is taken from the prose when the prose states it (``file:line`` at
the build commit) and otherwise from configuration (``config:build.<key>``). Both cases are
recorded: a fallback is reported, and a prose value that differs from the configured one is a
disagreement (prose wins: it is the commit's own runbook; the configuration may be stale).
"""

from __future__ import annotations

from domain.config import BuildSettings
from domain.contract.errors import ContractError
from domain.contract.models import (
    ArchLaunch,
    DeployRule,
    Disagreement,
    EnvPair,
    Fallback,
    LaunchTemplate,
    LayerCeiling,
    OpsContract,
)

_RESOURCE_FIELDS = ("cpu", "memory", "disk", "gpu", "max_retries", "timeout_s")
_COMMON_FIELDS = ("task_image", "no_sync", "enable_extra_resources", "job_name")


def _where(path: str, line: int) -> str:
    return f"{path}:{line}"


def _same(field: str, a, b) -> bool:
    if field == "task_image":
        return _image_ref(str(a)) == _image_ref(str(b))
    if field in ("memory", "disk"):
        return str(a).replace(" ", "").upper() == str(b).replace(" ", "").upper()
    if field == "job_name":
        return True  # a template, not a fact to compare
    return a == b


def _image_ref(ref: str) -> str:
    """docker.io/library/ubuntu:22.04 and ubuntu:22.04 name the same image."""
    parts = ref.split("/")
    if len(parts) == 1:
        parts = ["library", *parts]
    if "." not in parts[0] and ":" not in parts[0] and parts[0] != "localhost":
        parts = ["docker.io", *parts]
    return "/".join(parts)


class _Resolver:
    def __init__(self, ops: OpsContract, config: BuildSettings):
        self.ops, self.config = ops, config
        self.fallbacks: list[Fallback] = []
        self.disagreements: list[Disagreement] = []

    def _missing(self, what: str) -> str:
        if not self.ops.found:
            return f"no {self.ops.path} at the build commit"
        return f"{self.ops.path} does not state {what}"

    def pick(self, field: str, key: str, config_value, stated: list[tuple[object, int]], what: str):
        """The first stated (value, line); else the configured value. Records fallback/disagreement."""
        for value, line in stated:
            if value is None:
                continue
            if config_value is not None and not _same(field.rsplit(".", 1)[-1], value, config_value):
                self.disagreements.append(Disagreement(
                    file=self.ops.path, field=field, prose_value=str(value), prose_source=_where(self.ops.path, line),
                    script_value=str(config_value), other_source=f"config:{key}", against="configuration",
                    resolution=f"the commit's ops doc wins; update config {key} if the doc is right"))
            return value, _where(self.ops.path, line)
        self.fallbacks.append(Fallback(field=field, config_key=key, reason=self._missing(what)))
        return config_value, f"config:{key}"

    def arch(self, arch: str) -> ArchLaunch:
        ops, cfg = self.ops, self.config
        tpl = ops.templates.get(arch) or LaunchTemplate(arch=arch, line=0)
        common = ops.templates.get("*") or LaunchTemplate(arch="*", line=0)
        place = ops.placements.get(arch)
        acfg = cfg.architectures.get(arch)
        prov: dict[str, str] = {}
        values: dict[str, object] = {}

        def stated(t: LaunchTemplate, name: str) -> tuple[object, int]:
            return getattr(t, name), t.lines.get(name, t.line)

        base = f"build.architectures.{arch}"
        values["cluster"], prov["cluster"] = self.pick(
            f"{arch}.cluster", f"{base}.cluster", acfg.cluster if acfg else None,
            [(place.cluster if place else None, place.line if place else 0), stated(tpl, "cluster")],
            f"a build cluster for {arch}")
        prio_stated = [stated(tpl, "priority"), stated(common, "priority"),
                       (place.priority if place else None, place.line if place else 0)]
        values["priority"], prov["priority"] = self.pick(
            f"{arch}.priority", f"{base}.priority", acfg.priority if acfg else None, prio_stated,
            f"a priority for {arch}")
        for name in _RESOURCE_FIELDS:
            cfg_value = getattr(acfg, name) if acfg else None
            if name == "gpu" and tpl.cpu is not None and tpl.gpu is None:
                # a resource line that states cpu/memory and no --gpu means "no GPU"
                values[name], prov[name] = None, _where(ops.path, tpl.lines.get("cpu", tpl.line))
                if cfg_value is not None:
                    self.disagreements.append(Disagreement(
                        file=ops.path, field=f"{arch}.gpu", prose_value="none", script_value=str(cfg_value),
                        prose_source=prov[name], other_source=f"config:{base}.gpu", against="configuration",
                        resolution=f"the commit's ops doc wins; update config {base}.gpu if the doc is right"))
                continue
            values[name], prov[name] = self.pick(f"{arch}.{name}", f"{base}.{name}", cfg_value,
                                                 [stated(tpl, name), stated(common, name)],
                                                 f"--{name.replace('_s', '').replace('_', '-')} for {arch}")
        for name in _COMMON_FIELDS:
            values[name], prov[name] = self.pick(f"{arch}.{name}", f"build.{name}", getattr(cfg, name),
                                                 [stated(tpl, name), stated(common, name)],
                                                 f"--{name.replace('_', '-')} for {arch}")
        if tpl.command or common.command:
            t = tpl if tpl.command else common
            command, prov["command"] = list(t.command), _where(ops.path, t.lines.get("command", t.line))
        else:
            self.fallbacks.append(Fallback(field=f"{arch}.command", config_key="build.command",
                                           reason=self._missing(f"the `bash -lc` command for {arch}")))
            command, prov["command"] = list(cfg.command), "config:build.command"
        env: list[EnvPair] = []
        for pair in [*tpl.env, *common.env]:
            if pair.name not in {e.name for e in env}:
                env.append(pair)
                prov[f"env.{pair.name}"] = _where(ops.path, pair.line)
        joined = " ".join(command)
        script_var = next((e.name for e in env if e.is_reference and f"${e.name}" in joined and "base64" in joined), None)
        if script_var:
            prov["script_env_var"] = prov[f"env.{script_var}"]
        elif f"${cfg.script_env_var}" in joined or f"${{{cfg.script_env_var}}}" in joined:
            script_var, prov["script_env_var"] = cfg.script_env_var, "config:build.script_env_var"
            if not any(e.name == script_var for e in env):
                env.insert(0, EnvPair(name=script_var, value=f"${script_var}"))
                prov[f"env.{script_var}"] = "config:build.script_env_var"
        values["script_env_var"] = script_var
        if missing := [r for r in ("cluster", "cpu", "memory", "disk", "timeout_s") if values.get(r) is None]:
            raise ContractError(ops.path, 0, f"{', '.join(missing)} for {arch} in the ops doc or in config "
                                f"[{base}]")
        return ArchLaunch(arch=arch, env=env, command=command, provenance=prov, **values)  # type: ignore[arg-type]

    def megatron(self) -> tuple[list[EnvPair], str]:
        if self.ops.megatron_env:
            lines = sorted({e.line for e in self.ops.megatron_env})
            return list(self.ops.megatron_env), ",".join(_where(self.ops.path, n) for n in lines)
        self.fallbacks.append(Fallback(field="megatron_env", config_key="build.megatron_env",
                                       reason=self._missing("the Megatron `-e` add-on")))
        return [EnvPair(name=k, value=v) for k, v in self.config.megatron_env.items()], "config:build.megatron_env"

    def ceiling(self) -> tuple[LayerCeiling, dict[str, str]]:
        c = self.ops.layer_ceiling
        values: dict[str, int] = {}
        prov: dict[str, str] = {}
        for name in ("max_layer_bytes", "warn_layer_bytes", "min_layers"):
            stated = getattr(c, name)
            values[name], prov[f"layer_ceiling.{name}"] = self.pick(
                f"layer_ceiling.{name}", f"build.{name}", getattr(self.config, name),
                [(stated, c.lines.get(name, 0))], f"the layer ceiling ({name})")
        if values["warn_layer_bytes"] > values["max_layer_bytes"]:
            values["warn_layer_bytes"] = values["max_layer_bytes"]
        return LayerCeiling(**values), prov

    def boundary(self) -> list[DeployRule]:
        rules = list(self.ops.deploy_boundary)
        if not rules:
            self.fallbacks.append(Fallback(field="deploy_boundary", config_key="build.deploy_boundary",
                                           reason=self._missing("a deploy-boundary table")))
        stated = {r.glob for r in rules}
        for i, r in enumerate(self.config.deploy_boundary):
            if r.glob not in stated:  # prose rows first (first match wins); configuration covers the rest
                rules.append(DeployRule(glob=r.glob, rebuild=r.rebuild, reaches=r.reaches, line=0,
                                        source=f"config:build.deploy_boundary[{i}]"))
        return rules


def resolve_launch(ops: OpsContract, config: BuildSettings, arches: list[str]):
    """(launch per arch, megatron env, ceiling, boundary, provenance, fallbacks, disagreements)."""
    r = _Resolver(ops, config)
    launch = {}
    for a in arches:  # an arch with neither prose nor configuration is refused only when it is requested
        try:
            launch[a] = r.arch(a)
        except ContractError:
            continue
    megatron, megatron_src = r.megatron()
    ceiling, prov = r.ceiling()
    prov["megatron_env"] = megatron_src
    boundary = r.boundary()
    return launch, megatron, ceiling, boundary, prov, r.fallbacks, r.disagreements
