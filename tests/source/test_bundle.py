"""Iris bundle: deterministic zip, cap, exclusions, suspicious files; on real git checkouts."""

from __future__ import annotations

import os
import zipfile
from pathlib import Path

import git
import pytest

from clients.bundle import BundleTooLarge, SuspiciousBundle, build_bundle, list_bundle_files
from domain.bundle_rules import BundleFile, is_excluded, suspicious


@pytest.fixture
def checkout(tmp_path: Path) -> Path:
    root = tmp_path / "repo"
    repo = git.Repo.init(root, initial_branch="main")
    files = {
        "README.md": "hello\n",
        "docker/build.sh": "#!/bin/sh\necho hi\n",
        "cloud/iris/run_rl.py": "print(1)\n",
        ".gitignore": "*.log\nbuild/\n",
        "docs/images/big.txt": "excluded by iris\n",
        "pkg/__pycache__/x.cpython-311.pyc": "cache",
    }
    for rel, text in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)
    (root / "docker/build.sh").chmod(0o755)
    repo.git.add("--all", "--force")
    repo.git.execute(["git", "-c", "user.name=t", "-c", "user.email=t@e", "commit", "-qm", "init"])
    (root / "untracked.py").write_text("x = 1\n")
    (root / "debug.log").write_text("ignored\n")
    (root / "build").mkdir()
    (root / "build/out.txt").write_text("ignored\n")
    return root


def test_file_set_follows_iris_rules(checkout: Path):
    files = list_bundle_files(checkout)
    assert files == [".gitignore", "README.md", "cloud/iris/run_rl.py", "docker/build.sh", "untracked.py"]
    (checkout / "README.md").unlink()  # a deleted tracked file does not ride
    assert "README.md" not in list_bundle_files(checkout)


def test_bundle_is_deterministic(checkout: Path, tmp_path: Path):
    a = build_bundle(checkout, tmp_path / "a.zip")
    for p in checkout.rglob("*"):  # same content, different mtimes
        if p.is_file() and ".git" not in p.parts:
            os.utime(p, (1_000_000, 1_000_000))
    b = build_bundle(checkout, tmp_path / "b.zip")
    assert a.sha256 == b.sha256 and a.size_bytes == b.size_bytes and a.file_count == 5
    assert (tmp_path / "a.zip").read_bytes() == (tmp_path / "b.zip").read_bytes()
    with zipfile.ZipFile(tmp_path / "a.zip") as zf:
        assert zf.namelist() == sorted(zf.namelist())
        assert {i.date_time for i in zf.infolist()} == {(1980, 1, 1, 0, 0, 0)}
        modes = {i.filename: (i.external_attr >> 16) & 0o777 for i in zf.infolist()}
        assert modes["docker/build.sh"] == 0o755 and modes["README.md"] == 0o644
        assert zf.read("untracked.py") == b"x = 1\n"
    (checkout / "README.md").write_text("changed\n")
    assert build_bundle(checkout, tmp_path / "c.zip").sha256 != a.sha256


def test_oversized_bundle_refused_naming_largest_files(checkout: Path, tmp_path: Path):
    (checkout / "blob.dat").write_bytes(os.urandom(26 * 1024 * 1024))
    (checkout / "medium.dat").write_bytes(os.urandom(1024 * 1024))
    out = tmp_path / "big.zip"
    with pytest.raises(BundleTooLarge) as err:
        build_bundle(checkout, out, allow_suspicious=True)
    msg = str(err.value)
    assert "blob.dat (26.0 MiB)" in msg and "25.0 MiB" in msg and "medium.dat" in msg
    assert err.value.largest[0][0] == "blob.dat" and err.value.size_bytes > err.value.cap_bytes
    assert not out.exists() and not list(tmp_path.glob(".big.zip.*"))
    # Ignoring the file brings the bundle back under the cap.
    (checkout / ".gitignore").write_text("*.log\nbuild/\n*.dat\n")
    info = build_bundle(checkout, out)
    assert info.size_bytes < 1024 * 1024 and "blob.dat" not in list_bundle_files(checkout)


def test_wheel_flagged_and_refused_unless_allowed(checkout: Path, tmp_path: Path):
    (checkout / "docker/wheelhouse").mkdir(parents=True)
    (checkout / "docker/wheelhouse/vllm-0.1-cp312-linux_x86_64.whl").write_bytes(b"PK\x03\x04fake")
    with pytest.raises(SuspiciousBundle, match=r"vllm-0\.1-cp312-linux_x86_64\.whl: python wheel"):
        build_bundle(checkout, tmp_path / "s.zip")
    info = build_bundle(checkout, tmp_path / "s.zip", allow_suspicious=True)
    assert info.suspicious == [(
        "docker/wheelhouse/vllm-0.1-cp312-linux_x86_64.whl",
        "python wheel (.whl); inside a wheelhouse/ directory",
    )]


def test_suspicious_rules_pure():
    mib = 1024 * 1024
    found = dict(suspicious([
        BundleFile(path="a/model.safetensors", size_bytes=10),
        BundleFile(path="w.tar.gz", size_bytes=10),
        BundleFile(path="data.txt", size_bytes=6 * mib),
        BundleFile(path="blob", size_bytes=3, head=b"a\0b"),
        BundleFile(path="logo.png", size_bytes=3, head=b"\x89PNG\0"),
        BundleFile(path="ok.py", size_bytes=3, head=b"x=1"),
        BundleFile(path="docker/wheelhouse/.keep", size_bytes=0),  # the real tree commits it (Dockerfile.gpu-rl)
        BundleFile(path="docker/wheelhouse/.gitignore", size_bytes=14, head=b"*\n!.gitignore\n"),
        BundleFile(path="docker/wheelhouse/notes.txt", size_bytes=3, head=b"abc"),
        BundleFile(path="docker/wheelhouse/.keep2", size_bytes=0),
        BundleFile(path="docker/wheelhouse/x/.keep", size_bytes=4096),  # too big to be only a placeholder
    ]))
    assert found == {
        "a/model.safetensors": "binary by extension (.safetensors)",
        "w.tar.gz": "archive (.tar.gz)",
        "data.txt": "large file (6.0 MiB > 5.0 MiB)",
        "blob": "binary content (NUL byte)",
        "docker/wheelhouse/notes.txt": "inside a wheelhouse/ directory",
        "docker/wheelhouse/.keep2": "inside a wheelhouse/ directory",
        "docker/wheelhouse/x/.keep": "inside a wheelhouse/ directory",
    }


@pytest.mark.parametrize(
    ("path", "excluded"),
    [
        (".git/config", True), ("a/__pycache__/m.pyc", True), ("x.pyc", True), (".venv/bin/python", True),
        ("web/node_modules/a.js", True), ("pkg.egg-info/PKG-INFO", True), (".ruff_cache/x", True),
        ("clip.mov", True), ("docs/static/a.css", True), ("tests/snapshots/s.json", True),
        ("docs/guide.md", False), ("venvironment.py", False), ("skyrl-train/x.py", False),
    ],
)
def test_always_excluded_patterns(path: str, excluded: bool):
    assert is_excluded(path) is excluded


@pytest.mark.parametrize("link", ["file", "dir", "dangling", "inside"])
def test_symlinks_are_refused_naming_the_path(checkout: Path, tmp_path: Path, link: str):
    """A tracked symlink would ship what it points at on the worker (a mounted token) to Iris and the image."""
    from clients.bundle import NotARegularFile

    secret = tmp_path / "worker-secret"
    secret.write_text("worker-only-token\n")
    (tmp_path / "secrets-dir").mkdir()
    (tmp_path / "secrets-dir/token").write_text("worker-only-token\n")
    target = {"file": secret, "dir": tmp_path / "secrets-dir", "dangling": tmp_path / "nope",
              "inside": Path("../README.md")}[link]
    (checkout / "skyrl-train").mkdir()
    os.symlink(target, checkout / "skyrl-train/NOTES.txt")
    repo = git.Repo(checkout)
    repo.git.add("--all", "--force")
    repo.git.execute(["git", "-c", "user.name=t", "-c", "user.email=t@e", "commit", "-qm", "link"])
    out = tmp_path / "b.zip"
    with pytest.raises(NotARegularFile, match="skyrl-train/NOTES.txt: symlink to "):
        build_bundle(checkout, out)
    assert not out.exists()
