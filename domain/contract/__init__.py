"""The build contract of one MarinSkyRL commit, read from its files (pure: texts in, models out).

Use ``load_contract(files, commit)`` where ``files`` maps repo paths to their text at ``commit``:
``CORE_PATHS`` plus every Dockerfile the script names (``dockerfile_paths(script_text)``).
"""

from __future__ import annotations

from collections.abc import Mapping

from domain.contract.agents import AGENTS_PATH, parse_agents
from domain.contract.dockerfile import parse_dockerfile
from domain.contract.errors import ContractError
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
from domain.contract.reconcile import corrected_ops_text, find_disagreements
from domain.contract.script import SCRIPT_PATH, parse_script, render

CORE_PATHS = (AGENTS_PATH, OPS_PATH, SCRIPT_PATH)

__all__ = [
    "AGENTS_PATH", "CORE_PATHS", "OPS_PATH", "SCRIPT_PATH", "AgentsPolicy", "ArchSpec", "BuildContract",
    "Condition", "ConditionalPin", "ContractError", "ContractRow", "DeployRule", "Disagreement",
    "DockerfileContract", "EchoLine", "EnvPair", "Guard", "Knob", "LaunchTemplate", "LayerCeiling",
    "OpsContract", "Placement", "PolicyLine", "RequiredVar", "ScriptContract", "Stage", "WheelArtifact",
    "corrected_ops_doc", "dockerfile_paths", "load_contract", "parse_agents", "parse_bytes",
    "parse_dockerfile", "parse_ops", "parse_script", "render",
]


def _text(files: Mapping[str, str], path: str, commit: str) -> str:
    try:
        return files[path]
    except KeyError:
        raise ContractError(path, 0, f"the file at commit {commit}", "no such file") from None


def dockerfile_paths(script_text: str) -> list[str]:
    """The Dockerfiles the script's architecture table names (read these too before load_contract)."""
    return sorted({a.dockerfile for a in parse_script(script_text).arches.values()})


def load_contract(files: Mapping[str, str], commit: str) -> BuildContract:
    """Parse and cross-check every contract file; raises ContractError on anything unrecognized."""
    script = parse_script(_text(files, SCRIPT_PATH, commit), SCRIPT_PATH)
    dockerfiles: dict[str, DockerfileContract] = {}
    for arch in script.arches.values():
        if arch.dockerfile in dockerfiles:
            continue
        df = parse_dockerfile(_text(files, arch.dockerfile, commit), arch.dockerfile)
        for pin in script.pinned_args:
            if pin not in df.pins:
                raise ContractError(arch.dockerfile, 0, f"`ARG {pin}=<default>` (the build script pins {pin})")
        dockerfiles[arch.dockerfile] = df
    ops_text = _text(files, OPS_PATH, commit)
    ops = parse_ops(ops_text, OPS_PATH, uri_schemes=script.artifact_uri_schemes)
    agents = parse_agents(_text(files, AGENTS_PATH, commit), AGENTS_PATH)
    return BuildContract(
        commit=commit, script=script, dockerfiles=dockerfiles, ops=ops, agents=agents,
        disagreements=find_disagreements(script, ops), ops_text=ops_text,
    )


def corrected_ops_doc(contract: BuildContract) -> str | None:
    """The ops doc corrected to match the script (build-contract table), or None when it already does."""
    return corrected_ops_text(contract.script, contract.ops, contract.ops_text)
