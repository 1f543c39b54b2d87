"""Where the job runs the build script from: the bundle, when the script needs the files beside it.

Why: a launch that decodes the script from an env variable into a scratch file (``/tmp/build.sh``)
cuts it off from its siblings; era C finds ``write_registry_auth.sh`` through ``SCRIPT_DIR`` (its own
directory) and dies with exit 127 after the downloads. The bundle already holds the script at its repo
path under ``$IRIS_WORKDIR`` (``/app``), so such a script runs from there. The script outranks the ops
doc's template: the stale template is corrected in the build commit and reported.
"""

from __future__ import annotations

import shlex

from domain.contract.models import ScriptContract


def bundle_command(script_path: str) -> list[str]:
    """Run the script from its path in the unpacked bundle (``/app`` unless Iris says otherwise)."""
    return ["bash", "-lc", f'exec bash "${{IRIS_WORKDIR:-/app}}/{script_path}"']


def runs_detached_copy(command: list[str], script_env_var: str | None) -> bool:
    """Does the command run a copy of the script decoded from an env variable (not the bundle's file)?"""
    return bool(script_env_var) and any(f"${script_env_var}" in c or f"${{{script_env_var}}}" in c
                                        for c in command)


def needs_bundle_launch(script: ScriptContract, command: list[str], script_env_var: str | None) -> bool:
    return "self_location" in script.lines and runs_detached_copy(command, script_env_var)


def command_text(command: list[str]) -> str:
    return shlex.join(command)
