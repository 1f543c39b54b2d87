"""The build contract of one MarinSkyRL commit, read from its files (pure: texts in, models out).

Use ``load_contract(files, commit)`` where ``files`` maps repo paths to their text at ``commit``:
``CORE_PATHS`` plus every Dockerfile the script names (``dockerfile_paths(script_text)``).
"""

from __future__ import annotations

from collections.abc import Mapping

from domain.config import BuildSettings
from domain.contract.agents import AGENTS_PATH, parse_agents
from domain.contract.dockerfile import arch_dockerfiles, parse_dockerfile
from domain.contract.errors import ContractError
from domain.contract.launch import bundle_command, command_text, needs_bundle_launch
from domain.contract.models import (
    AgentsPolicy,
    ArchSpec,
    BuildContract,
    Condition,
    ConditionalPin,
    ContractRow,
    DeployRule,
    Disagreement,
    DockerfileContract,
    EchoLine,
    EnvPair,
    Fallback,
    Guard,
    Knob,
    LaunchTemplate,
    LayerCeiling,
    OpsContract,
    Placement,
    PolicyLine,
    RequiredVar,
    ScriptContract,
    Stage,
    WheelArtifact,
)
from domain.contract.ops import OPS_PATH, parse_bytes, parse_ops
from domain.contract.reconcile import (
    OpsCorrection,
    OpsFix,
    UncorrectableProse,
    correct_ops,
    corrected_ops_text,
    find_disagreements,
    tag_form_disagreements,
)
from domain.contract.resolve import resolve_launch
from domain.contract.script import SCRIPT_PATH, parse_script, render

CORE_PATHS = (AGENTS_PATH, OPS_PATH, SCRIPT_PATH)

__all__ = [
    "AGENTS_PATH", "CORE_PATHS", "OPS_PATH", "SCRIPT_PATH", "AgentsPolicy", "ArchSpec", "BuildContract",
    "Condition", "ConditionalPin", "ContractError", "ContractRow", "DeployRule", "Disagreement",
    "DockerfileContract", "EchoLine", "EnvPair", "Fallback", "Guard", "Knob", "LaunchTemplate", "LayerCeiling",
    "OpsContract", "OpsCorrection", "OpsFix", "Placement", "PolicyLine", "RequiredVar", "ScriptContract", "Stage",
    "UncorrectableProse", "WheelArtifact",
    "correct_ops", "corrected_ops_doc", "describe_disagreement", "dockerfile_paths", "load_contract", "ops_fix",
    "parse_agents",
    "parse_bytes",
    "parse_dockerfile", "parse_ops", "parse_script", "render",
]


def _decode(path: str, data: str | bytes) -> str:
    """UTF-8 text of a contract file; anything else fails at once (never retried) naming the file."""
    if isinstance(data, str):
        return data
    if data[:2] in (b"\xff\xfe", b"\xfe\xff"):
        raise ContractError(path, 0, "UTF-8 text", "a UTF-16 file (byte-order mark); re-save it as UTF-8")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise ContractError(path, 0, "UTF-8 text", f"undecodable byte at offset {e.start}; re-save it as UTF-8"
                            ) from None


def _text(files: Mapping[str, str | bytes], path: str, commit: str) -> str:
    try:
        return _decode(path, files[path])
    except KeyError:
        raise ContractError(path, 0, f"the file at commit {commit}", "no such file") from None


def _optional(files: Mapping[str, str | bytes], path: str) -> str | None:
    return _decode(path, files[path]) if path in files else None


def dockerfile_paths(script_text: str) -> list[str]:
    """The Dockerfiles the script's architecture table names (read these too before load_contract)."""
    return sorted({a.dockerfile for a in parse_script(script_text).arches.values()})


def load_contract(files: Mapping[str, str | bytes], commit: str, defaults: BuildSettings | None = None
                  ) -> BuildContract:
    """Parse and cross-check every contract file (texts or bytes, by repo path).

    The script and Dockerfiles are the executable contract: anything unrecognized raises ContractError.
    The ops doc and AGENTS.md are prose: missing or reshaped parts fall back to ``defaults`` (the
    service configuration's ``[build]``), recorded as fallbacks and disagreements, never refused.
    """
    defaults = defaults or BuildSettings()
    script = parse_script(_text(files, SCRIPT_PATH, commit), SCRIPT_PATH)
    dockerfiles = arch_dockerfiles(
        script, {p: _decode(p, t) for p, t in files.items() if p.rsplit("/", 1)[-1].startswith("Dockerfile")}, commit)
    ops_text = _optional(files, OPS_PATH)
    ops = parse_ops(ops_text, OPS_PATH, uri_schemes=script.artifact_uri_schemes, arches=sorted(script.arches),
                    wheel_source_var=script.wheel_source_var, wheel_sources=script.wheel_sources,
                    megatron_var=script.megatron_var)
    agents = parse_agents(_optional(files, AGENTS_PATH), AGENTS_PATH)
    launch, megatron, ceiling, boundary, provenance, fallbacks, config_disagreements = resolve_launch(
        ops, defaults, sorted(script.arches))
    config_disagreements += _launch_from_bundle(script, ops.path, launch)
    if not agents.policy:
        fallbacks.append(Fallback(field="policy", config_key="github.do_not_touch",
                                  reason=f"{AGENTS_PATH} " + ("states no policy section" if AGENTS_PATH in files
                                                                else "does not exist at the build commit")))
    return BuildContract(
        commit=commit, script=script, dockerfiles=dockerfiles, ops=ops, agents=agents,
        disagreements=find_disagreements(script, ops, ops_text or "") + tag_form_disagreements(script, ops, megatron)
        + config_disagreements, ops_text=ops_text or "",
        launch=launch, megatron_env=megatron, layer_ceiling=ceiling, deploy_boundary=boundary,
        provenance=provenance, fallbacks=fallbacks,
    )


def _launch_from_bundle(script: ScriptContract, ops_path: str, launch: dict) -> list[Disagreement]:
    """A script that finds files beside itself runs from the bundle, not from a decoded copy (script wins)."""
    out: list[Disagreement] = []
    seen: set[str] = set()
    where = f"{script.path}:{script.lines.get('self_location', 0)}"
    for a in launch.values():
        if not needs_bundle_launch(script, a.command, a.script_env_var):
            continue
        old, old_src, carrier = a.command, a.provenance.get("command", ""), a.script_env_var
        a.command = bundle_command(script.path)
        a.provenance["command"] = f"{where} (the script finds files beside itself: run from the bundle; " \
                                  f"instead of {old_src})"
        a.env = [e for e in a.env if e.name != carrier]
        a.provenance.pop(f"env.{carrier}", None)
        a.provenance.pop("script_env_var", None)
        a.script_env_var = None
        if old_src in seen:
            continue
        seen.add(old_src)
        out.append(Disagreement(
            file=ops_path, field="launch command", prose_value=command_text(old), prose_source=old_src,
            script_value=command_text(a.command), other_source=where,
            resolution=f"script wins: it locates its siblings from its own path ({where}), so a copy decoded "
                       f"from ${carrier} into a scratch file cannot find them; the job runs the bundle's "
                       f"{script.path} (no {carrier}); corrected in the build commit"))
    return out


def describe_disagreement(d: Disagreement) -> str:
    """One line for the operator: what the prose says and where, what wins and why."""
    prose = f"{d.prose_value!r}" + (f" at {d.prose_source}" if d.prose_source else "")
    other = f"{d.script_value!r}" + (f" at {d.other_source}" if d.other_source else "")
    return f"{d.file}: {d.field}: prose {prose}, {d.against} {other} → {d.resolution}"


def corrected_ops_doc(contract: BuildContract) -> str | None:
    """The ops doc corrected to match the script (build-contract table), or None when it already does."""
    return corrected_ops_text(contract.script, contract.ops, contract.ops_text)


def ops_fix(contract: BuildContract, *, pin_table: str | None = None, protected: list[str] | set[str] = ()) -> OpsFix:
    """The ops doc corrected (script and runbook rules), each corrected line with why; raises
    ``UncorrectableProse`` naming the line when a stale fact cannot be rewritten safely."""
    return correct_ops(contract.script, contract.ops, contract.ops_text, pin_table=pin_table,
                       protected=set(protected) | set(contract.agents.do_not_touch), megatron_env=contract.megatron_env)
