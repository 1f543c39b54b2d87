import os
import sys

import pytest

from clients.credentials import CredentialError, fetch_secret
from domain.config import CredentialSource
from domain.redact import REDACTED, redact, redact_obj


def test_fetched_secrets_are_redacted_everywhere(tmp_path, monkeypatch):
    monkeypatch.setenv("SENTINEL_TOKEN_X", "s3ntinel-value-1234")
    assert fetch_secret(CredentialSource(kind="env", name="SENTINEL_TOKEN_X"), what="t") == "s3ntinel-value-1234"
    assert redact("token=s3ntinel-value-1234 ok") == f"token={REDACTED} ok"
    assert redact_obj({"a": ["x s3ntinel-value-1234"]}) == {"a": [f"x {REDACTED}"]}
    assert REDACTED in redact("Authorization: Bearer abc.def") and "abc.def" not in redact("Authorization: Bearer abc.def")
    assert "ghp_" not in redact("leak ghp_" + "A" * 36)


def test_file_and_command_sources(tmp_path):
    f = tmp_path / "tok"
    f.write_text("from-file-secret\n")
    assert fetch_secret(CredentialSource(kind="file", path=str(f)), what="t") == "from-file-secret"
    cmd = CredentialSource(kind="command", argv=[sys.executable, "-c", "print('cmd-secret-9')"])
    assert fetch_secret(cmd, what="t") == "cmd-secret-9"


def test_errors_name_the_source_not_the_value(tmp_path):
    os.environ.pop("NOPE_NOT_SET", None)
    with pytest.raises(CredentialError, match="environment variable NOPE_NOT_SET is not set"):
        fetch_secret(CredentialSource(kind="env", name="NOPE_NOT_SET"), what="registry.token")
    with pytest.raises(CredentialError, match=r"cannot read .*missing"):
        fetch_secret(CredentialSource(kind="file", path=str(tmp_path / "missing")), what="registry.token")
    fail = CredentialSource(kind="command", argv=[sys.executable, "-c", "import sys; sys.exit(3)"])
    with pytest.raises(CredentialError, match="exited 3"):
        fetch_secret(fail, what="registry.token")
