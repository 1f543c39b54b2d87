"""Iris workspace-bundle rules: which files ride to ``/app`` and which ones look wrong.

Why: Iris zips ``git ls-files --cached --others --exclude-standard`` of the submit directory minus a
fixed exclusion list, and both client and controller reject a zip over 25 MiB with no per-file
override. Wheels (~900 MB) and other build artefacts must never ride the bundle, so they are flagged
before submission. The exclusion pattern mirrors ``iris.cluster.client.bundle.DEFAULT_EXCLUDE``.

Pure: paths, sizes and a few leading bytes in; decisions out.
"""

from __future__ import annotations

import re

from pydantic import BaseModel, ConfigDict

MAX_BUNDLE_SIZE_BYTES = 25 * 1024 * 1024
LARGE_FILE_BYTES = 5 * 1024 * 1024
SNIFF_BYTES = 8192

ALWAYS_EXCLUDED = re.compile(
    r"""
      \.mov$
    | \.pyc$
    | \.egg-info(/|$)
    | (^|/)__pycache__(/|$)
    | (^|/)\.git(/|$)
    | (^|/)\.mypy_cache(/|$)
    | (^|/)\.pytest_cache(/|$)
    | (^|/)\.ruff_cache(/|$)
    | (^|/)\.venv(/|$)
    | (^|/)node_modules(/|$)
    | (^|/)venv(/|$)
    | (^|/)docs/figures(/|$)
    | (^|/)docs/images(/|$)
    | (^|/)docs/reports(/|$)
    | (^|/)docs/static(/|$)
    | (^|/)tests/snapshots(/|$)
    """,
    re.VERBOSE,
)

ARCHIVE_SUFFIXES = (
    ".tar.gz", ".tar.bz2", ".tar.xz", ".tar.zst", ".tgz", ".tbz2", ".txz", ".tar", ".zip", ".gz",
    ".bz2", ".xz", ".zst", ".7z", ".rar",
)
BINARY_SUFFIXES = (
    ".so", ".dylib", ".dll", ".exe", ".bin", ".o", ".a", ".pyd", ".pt", ".pth", ".ckpt",
    ".safetensors", ".npy", ".npz", ".pkl", ".pickle", ".onnx", ".h5", ".parquet", ".arrow", ".sqlite",
    ".db", ".jar", ".deb", ".rpm", ".iso", ".img",
)
# Files that only keep a directory in git (the real Dockerfile COPYs ``docker/wheelhouse/``, which
# "always exists (committed .keep)"): inside a wheelhouse they are no artefact while this small.
PLACEHOLDER_NAMES = (".keep", ".gitkeep", ".gitignore", "README", "README.md")
PLACEHOLDER_MAX_BYTES = 1024
# Small media a repository legitimately tracks; flagged only when large.
BENIGN_BINARY_SUFFIXES = (".png", ".jpg", ".jpeg", ".gif", ".ico", ".svg", ".webp", ".pdf")


class BundleFile(BaseModel):
    """Facts about one candidate file: relative posix path, size and its first bytes."""

    model_config = ConfigDict(frozen=True)

    path: str
    size_bytes: int
    head: bytes = b""


def is_excluded(path: str) -> bool:
    """True when Iris always leaves ``path`` (relative, forward slashes) out of the bundle."""
    return bool(ALWAYS_EXCLUDED.search(path))


def filter_bundle_paths(paths: list[str]) -> list[str]:
    """The ``git ls-files`` output minus the always-excluded patterns, sorted and de-duplicated."""
    return sorted({p for p in paths if p and not is_excluded(p)})


def suspicion_reasons(file: BundleFile) -> list[str]:
    """Why ``file`` probably should not ride the bundle (empty when it looks fine)."""
    lower = file.path.lower()
    reasons: list[str] = []
    if file.size_bytes > LARGE_FILE_BYTES:
        reasons.append(f"large file ({_mib(file.size_bytes)} > {_mib(LARGE_FILE_BYTES)})")
    if lower.endswith(".whl"):
        reasons.append("python wheel (.whl)")
    archive = next((s for s in ARCHIVE_SUFFIXES if lower.endswith(s)), None)
    if archive:
        reasons.append(f"archive ({archive})")
    parts = file.path.split("/")
    placeholder = parts[-1] in PLACEHOLDER_NAMES and file.size_bytes <= PLACEHOLDER_MAX_BYTES
    if "wheelhouse" in lower.split("/")[:-1] and not placeholder:
        reasons.append("inside a wheelhouse/ directory")
    binary = next((s for s in BINARY_SUFFIXES if lower.endswith(s)), None)
    if binary:
        reasons.append(f"binary by extension ({binary})")
    elif not archive and not lower.endswith(".whl") and not lower.endswith(BENIGN_BINARY_SUFFIXES):
        if b"\0" in file.head[:SNIFF_BYTES]:
            reasons.append("binary content (NUL byte)")
    return reasons


def suspicious(files: list[BundleFile]) -> list[tuple[str, str]]:
    """(path, reasons joined by '; ') for every file that looks like a build artefact or is large."""
    out = []
    for file in sorted(files, key=lambda f: f.path):
        reasons = suspicion_reasons(file)
        if reasons:
            out.append((file.path, "; ".join(reasons)))
    return out


def largest(files: list[BundleFile], n: int = 5) -> list[tuple[str, int]]:
    """The ``n`` biggest files, biggest first (ties by path, so the order is stable)."""
    ranked = sorted(files, key=lambda f: (-f.size_bytes, f.path))
    return [(f.path, f.size_bytes) for f in ranked[:n]]


def too_large_message(size_bytes: int, cap_bytes: int, biggest: list[tuple[str, int]]) -> str:
    """Error text naming the size, the cap and the largest files."""
    names = ", ".join(f"{path} ({_mib(size)})" for path, size in biggest) or "(no files)"
    return (
        f"bundle is {_mib(size_bytes)} ({size_bytes} bytes), over the Iris cap of {_mib(cap_bytes)} "
        f"({cap_bytes} bytes); largest files: {names}"
    )


def _mib(n: int) -> str:
    return f"{n / (1024 * 1024):.1f} MiB"
