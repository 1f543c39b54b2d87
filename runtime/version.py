"""The service's version for ``--version``: the installed distribution's metadata, else pyproject.toml.

Why both: an installed worker image answers from its wheel's metadata (what was really deployed); a
source checkout run as ``python starter.py`` without ``pip install`` still answers, from the file the
wheel would be built from.
"""

from __future__ import annotations

import tomllib
from importlib import metadata
from pathlib import Path

DISTRIBUTION = "gpu-rl-builder"
PYPROJECT = Path(__file__).resolve().parents[1] / "pyproject.toml"


def version(distribution: str = DISTRIBUTION, pyproject: Path = PYPROJECT) -> str:
    try:
        return metadata.version(distribution)
    except metadata.PackageNotFoundError:
        pass
    try:
        return tomllib.loads(pyproject.read_text())["project"]["version"]
    except (OSError, KeyError, tomllib.TOMLDecodeError):
        return "unknown (not installed, no pyproject.toml)"
