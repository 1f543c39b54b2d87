"""Shared test inputs: the fixture repository's contract files, optionally edited per test."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from domain.contract import CORE_PATHS, BuildContract, load_contract

FIXTURE = Path(__file__).resolve().parents[2] / "sandbox" / "fixtures" / "marinskyrl"
HARBOR = "b" * 40
COMMIT = "a" * 40
SCRIPT = "docker/build_gpu_rl_kaniko.sh"
OPS = ".agents/ops/gpu-rl-image-build.md"
DF_AMD = "docker/Dockerfile.gpu-rl"
DF_ARM = "docker/Dockerfile.gpu-rl-arm64"


def fixture_files(harbor: str = HARBOR) -> dict[str, str]:
    paths = [*CORE_PATHS, DF_AMD, DF_ARM]
    return {p: (FIXTURE / p).read_text().replace("{{HARBOR_COMMIT}}", harbor) for p in paths}


def edited(path: str, edit: Callable[[str], str], files: dict[str, str] | None = None) -> dict[str, str]:
    files = dict(files or fixture_files())
    new = edit(files[path])
    assert new != files[path], f"edit did not change {path}"
    files[path] = new
    return files


def contract(files: dict[str, str] | None = None, commit: str = COMMIT) -> BuildContract:
    return load_contract(files or fixture_files(), commit)


def line_of(text: str, needle: str) -> int:
    for i, line in enumerate(text.splitlines(), 1):
        if needle in line:
            return i
    raise AssertionError(needle)
