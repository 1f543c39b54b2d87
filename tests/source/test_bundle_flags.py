"""The bundle's suspicious-file rule has a real CLI flag, and git-lfs pointers are refused (#35 item 5), on the
real era-C tree with one committed file added: a 6 MiB data file was refused with advice to "pass
allow_suspicious=True", which no command offers; a git-lfs pointer was bundled as its 130-byte stub."""

from __future__ import annotations

import pytest
from click.testing import CliRunner

from clients.bundle import LfsPointer, SuspiciousBundle, build_bundle
from tests.contract.real import commit_tree

POINTER = ("version https://git-lfs.github.com/spec/v1\n"
           "oid sha256:4d7a214614ab2935c943f9e0ff69d22eadbb8f32b1258daaa5e2ca24d17e2393\nsize 6291456\n")


def _tree(tmp_path, path: str, content: bytes):
    """The real era-C tree with one more committed file."""
    from pathlib import Path

    repo, _ = commit_tree(tmp_path, "era-c", rest=True)
    full = Path(repo.working_dir) / path
    full.parent.mkdir(parents=True, exist_ok=True)
    full.write_bytes(content)
    repo.index.add([path])
    repo.index.commit(f"add {path}")
    return repo


def test_a_large_file_refusal_names_the_cli_flag_and_the_flag_bundles_it(tmp_path):
    repo = _tree(tmp_path, "cloud/data/table.csv", b"a,b\n" * (6 * 1024 * 1024 // 4))
    with pytest.raises(SuspiciousBundle) as e:
        build_bundle(repo.working_dir, tmp_path / "b.zip")
    assert "cloud/data/table.csv" in str(e.value) and "--allow-suspicious-files" in str(e.value)
    assert "allow_suspicious=True" not in str(e.value)
    assert build_bundle(repo.working_dir, tmp_path / "b.zip", allow_suspicious=True).file_count > 0
    import starter

    assert "--allow-suspicious-files" in CliRunner().invoke(starter.cli, ["build", "--help"]).output
    from domain.operator_input import build_request

    assert build_request(architectures=["amd64"], variants=["standard"], requested_by="a", reason="r",
                         allow_suspicious_files=True).allow_suspicious_files


def test_a_git_lfs_pointer_is_refused_even_with_the_flag(tmp_path):
    repo = _tree(tmp_path, "cloud/data/model.bin", POINTER.encode())
    for allow in (False, True):
        with pytest.raises(LfsPointer, match=r"git-lfs pointer file\(s\), not their content: cloud/data/model.bin"):
            build_bundle(repo.working_dir, tmp_path / "b.zip", allow_suspicious=allow)
