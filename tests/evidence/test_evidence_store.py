"""The evidence store on fsspec's own filesystems: what one process writes, another reads by URI.

A local directory stands for the production bucket (``file://``); ``memory://`` shows the store takes
any fsspec URL; the digest recorded in history guards every read."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from clients.evidence import EvidenceError, EvidenceStore, read_evidence
from domain.models import FileRef
from domain.redact import REDACTED, register_secret

ROOT = Path(__file__).resolve().parents[2]


def test_a_file_written_by_one_process_is_read_by_another_from_its_uri_alone(tmp_path):
    store = EvidenceStore(f"file://{tmp_path}/bucket")
    ref = store.put_text("gpu-rl-build-abc/def", "/gpu-rl-builder/gpurl-kaniko-amd64.log", "step 1\nexit status 3\n")
    assert ref.uri == f"file://{tmp_path}/bucket/gpu-rl-build-abc_def/gpu-rl-builder_gpurl-kaniko-amd64.log"
    code = ("import sys; from clients.evidence import read_evidence; from domain.models import FileRef; "
            "sys.stdout.write(read_evidence(FileRef.model_validate_json(sys.argv[1])).decode())")
    out = subprocess.run([sys.executable, "-c", code, ref.model_dump_json()], cwd=ROOT, capture_output=True,
                         text=True, check=True, timeout=60).stdout
    assert out == "step 1\nexit status 3\n"


def test_secrets_are_redacted_before_anything_is_written(tmp_path):
    secret = "sentinel-evidence-token-0123456789"
    register_secret(secret)
    store = EvidenceStore(str(tmp_path))
    ref = store.put_text("r", "x.log", f"push with {secret} failed\n")
    on_disk = next(tmp_path.rglob("x.log")).read_text()
    assert secret not in on_disk and REDACTED in on_disk
    assert read_evidence(ref).decode() == on_disk


def test_an_altered_or_missing_file_is_refused_naming_its_uri(tmp_path):
    store = EvidenceStore(str(tmp_path))
    ref = store.put_text("r", "x.log", "original\n")
    next(tmp_path.rglob("x.log")).write_text("altered\n")
    with pytest.raises(EvidenceError, match="does not match the recorded"):
        read_evidence(ref)
    with pytest.raises(EvidenceError, match="not found in the evidence store"):
        read_evidence(FileRef(uri=f"file://{tmp_path}/r/gone.log", sha256="0" * 64, size_bytes=1))


def test_another_fsspec_filesystem_works_by_url_alone():
    mem = EvidenceStore("memory://evidence-test")
    ref = mem.put_text("r", "m.log", "in memory")
    assert ref.uri == "memory:///evidence-test/r/m.log" and read_evidence(ref) == b"in memory"


def test_an_unknown_protocol_is_a_configuration_error_naming_the_setting():
    with pytest.raises(EvidenceError, match="evidence.url 'nope://bucket'"):
        EvidenceStore("nope://bucket")


def test_histories_written_before_the_store_still_decode():
    old = FileRef.model_validate({"path": "/work/evidence/r/x.log", "sha256": "a" * 64, "size_bytes": 3})
    assert old.uri == "/work/evidence/r/x.log" and "uri" in old.model_dump()
