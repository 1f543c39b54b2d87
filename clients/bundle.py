"""Build the Iris workspace bundle as a deterministic zip.

Why deterministic: the bundle is content-addressed (``sha256(zip)``) by Iris, and a retried activity
must produce the same bytes for the same tree so the evidence recorded for a build is stable. Entries
are sorted, timestamps fixed, permissions reduced to 0644/0755 and compression fixed.

The file set follows Iris (``git ls-files --cached --others --exclude-standard`` minus the
always-excluded patterns). Refuses bundles over the 25 MiB cap (no override exists in Iris either)
and, unless ``allow_suspicious``, bundles carrying wheels, archives, binaries or large files.
"""

from __future__ import annotations

import hashlib
import os
import stat
import subprocess
import tempfile
import zipfile
from pathlib import Path

from pydantic import BaseModel, ConfigDict

from clients.child_env import child_env
from domain.bundle_rules import (
    MAX_BUNDLE_SIZE_BYTES,
    SNIFF_BYTES,
    BundleFile,
    filter_bundle_paths,
    largest,
    suspicious,
    too_large_message,
)

FIXED_DATE_TIME = (1980, 1, 1, 0, 0, 0)
COMPRESS_LEVEL = 6


class BundleError(RuntimeError):
    """Base class for bundle refusals."""


class BundleTooLarge(BundleError):
    def __init__(self, size_bytes: int, cap_bytes: int, biggest: list[tuple[str, int]]):
        super().__init__(too_large_message(size_bytes, cap_bytes, biggest))
        self.size_bytes = size_bytes
        self.cap_bytes = cap_bytes
        self.largest = biggest


class SuspiciousBundle(BundleError):
    def __init__(self, found: list[tuple[str, str]]):
        listed = "; ".join(f"{path}: {reason}" for path, reason in found[:10])
        more = f" (+{len(found) - 10} more)" if len(found) > 10 else ""
        super().__init__(
            f"bundle would carry {len(found)} suspicious file(s): {listed}{more}. Remove or gitignore "
            "them, or pass --allow-suspicious-files (gpu-rl-builder build) after reviewing them"
        )
        self.suspicious = found


LFS_POINTER = b"version https://git-lfs.github.com/spec/v1\n"


class LfsPointer(BundleError):
    """A git-lfs pointer: the bundle (what git tracks) carries the pointer text, not the file, so the image
    would COPY a 130-byte stub. Refused whatever the flags: no build wants a pointer."""

    def __init__(self, found: list[str]):
        listed = ", ".join(found[:10]) + (f" (+{len(found) - 10} more)" if len(found) > 10 else "")
        super().__init__(f"the bundle would carry git-lfs pointer file(s), not their content: {listed}; Iris "
                         "bundles what git tracks, so the build would COPY the pointer text: commit the file "
                         "itself (under 25 MiB) or have the build script fetch it")
        self.found = found


class NotAGitWorktree(BundleError):
    pass


class NotARegularFile(BundleError):
    """A bundle path that is a symlink or resolves outside the worktree: it would ship whatever the link
    points at on the worker (a mounted secret, another checkout) to Iris, its bundle store and the image."""

    def __init__(self, found: list[tuple[str, str]]):
        listed = "; ".join(f"{path}: {reason}" for path, reason in found[:10])
        more = f" (+{len(found) - 10} more)" if len(found) > 10 else ""
        super().__init__(f"the bundle holds regular files of the repository only: {listed}{more}; remove the "
                         "link from the repository (or replace it with the file it points at)")
        self.found = found


class BundleInfo(BaseModel):
    model_config = ConfigDict(frozen=True)

    path: Path
    sha256: str
    size_bytes: int
    file_count: int
    largest: list[tuple[str, int]]
    suspicious: list[tuple[str, str]]


def list_bundle_files(worktree: Path) -> list[str]:
    """Relative paths Iris would bundle from ``worktree`` (existing regular files only)."""
    try:
        out = subprocess.run(
            ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
            cwd=worktree, capture_output=True, check=True, env=child_env(),
        ).stdout
    except subprocess.CalledProcessError as exc:
        raise NotAGitWorktree(f"{worktree}: git ls-files failed: {exc.stderr.decode(errors='replace')}") from exc
    paths = [p.decode("utf-8", errors="surrogateescape") for p in out.split(b"\0")]
    # Iris keeps what is_file() accepts, following links: a tracked symlink would ship its target's content.
    # Refused instead (a deleted tracked file still drops out).
    root = worktree.resolve()
    kept, refused = [], []
    for p in filter_bundle_paths(paths):
        full = worktree / p
        if full.is_symlink() or any(parent.is_symlink() for parent in _parents_within(worktree, p)):
            refused.append((p, f"symlink to {os.readlink(full) if full.is_symlink() else 'a linked directory'}"))
        elif not full.exists():
            continue
        elif not full.resolve().is_relative_to(root):
            refused.append((p, "resolves outside the worktree"))
        elif full.is_file():
            kept.append(p)
        else:
            refused.append((p, "not a regular file"))
    if refused:
        raise NotARegularFile(refused)
    return kept


def _parents_within(worktree: Path, rel: str) -> list[Path]:
    """The directories between ``worktree`` and ``rel`` (a linked directory makes every file below it a link)."""
    parts = Path(rel).parts[:-1]
    return [worktree.joinpath(*parts[:i]) for i in range(1, len(parts) + 1)]


def describe_files(worktree: Path, paths: list[str]) -> list[BundleFile]:
    files = []
    for rel in paths:
        full = worktree / rel
        with full.open("rb") as fh:
            head = fh.read(SNIFF_BYTES)
        files.append(BundleFile(path=rel, size_bytes=full.stat().st_size, head=head))
    return files


def build_bundle(
    worktree: Path,
    out_path: Path,
    *,
    allow_suspicious: bool = False,
    max_size_bytes: int = MAX_BUNDLE_SIZE_BYTES,
) -> BundleInfo:
    """Zip the bundle of ``worktree`` into ``out_path`` (written atomically) and describe it."""
    worktree, out_path = Path(worktree), Path(out_path)
    paths = list_bundle_files(worktree)
    files = describe_files(worktree, paths)
    pointers = [f.path for f in files if f.head.startswith(LFS_POINTER)]
    if pointers:
        raise LfsPointer(pointers)
    flagged = suspicious(files)
    biggest = largest(files)
    out_path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp_name = tempfile.mkstemp(prefix=f".{out_path.name}.", suffix=".tmp", dir=out_path.parent)
    os.close(fd)
    tmp = Path(tmp_name)
    try:
        digest = _write_zip(worktree, paths, tmp)
        size = tmp.stat().st_size
        if size > max_size_bytes:
            raise BundleTooLarge(size, max_size_bytes, biggest)
        if flagged and not allow_suspicious:
            raise SuspiciousBundle(flagged)
        os.replace(tmp, out_path)
    finally:
        tmp.unlink(missing_ok=True)
    return BundleInfo(
        path=out_path, sha256=digest, size_bytes=size, file_count=len(paths), largest=biggest,
        suspicious=flagged,
    )


def _write_zip(worktree: Path, paths: list[str], dest: Path) -> str:
    with zipfile.ZipFile(dest, "w", zipfile.ZIP_DEFLATED, compresslevel=COMPRESS_LEVEL) as zf:
        for rel in sorted(paths):
            full = worktree / rel
            mode = 0o755 if full.stat().st_mode & (stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH) else 0o644
            info = zipfile.ZipInfo(rel, date_time=FIXED_DATE_TIME)
            info.create_system = 3  # unix, so external_attr carries the mode
            info.external_attr = (stat.S_IFREG | mode) << 16
            info.compress_type = zipfile.ZIP_DEFLATED
            with full.open("rb") as src, zf.open(info, "w") as dst:
                while chunk := src.read(1024 * 1024):
                    dst.write(chunk)
    sha = hashlib.sha256()
    with dest.open("rb") as fh:
        while chunk := fh.read(1024 * 1024):
            sha.update(chunk)
    return sha.hexdigest()
