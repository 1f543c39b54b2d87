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


# ------------------------------------------------------------------ every encoding (issue #21 item 3)
SECRET = "s3nt1nel+Enc/oded=Tok3n-ABCDEFGH"


def _middle(text: str, trim: int = 4) -> str:
    """What a reader could still recover: the stream with its edge characters trimmed (independent of
    how domain.redact computes its cores)."""
    return text[trim:-trim]


@pytest.mark.parametrize("form", [
    "raw", "quote", "quote_plus", "b64", "b64_nopad", "urlsafe", "urlsafe_nopad",
    "basic_user_0", "basic_user_1", "basic_user_2", "in_stream_0", "in_stream_1", "in_stream_2",
    "auth_basic", "auth_bearer", "docker_auth_json", "proxy_auth"])
def test_every_encoding_of_a_registered_secret_is_redacted(form):
    import base64
    from urllib.parse import quote, quote_plus

    from domain.redact import register_secret

    register_secret(SECRET)
    raw = SECRET.encode()
    users = {"basic_user_0": "abc", "basic_user_1": "ab", "basic_user_2": "a"}  # user + ':' at 3 alignments
    streams = {"in_stream_0": b"", "in_stream_1": b"x", "in_stream_2": b"xy"}
    if form == "raw":
        leak = needle = SECRET
    elif form in ("quote", "quote_plus"):
        leak = needle = (quote(SECRET, safe="") if form == "quote" else quote_plus(SECRET))
        assert leak != SECRET
    elif form.startswith(("b64", "urlsafe")):
        enc = base64.b64encode if form.startswith("b64") else base64.urlsafe_b64encode
        leak = enc(raw).decode()
        leak = leak.rstrip("=") if form.endswith("nopad") else leak
        needle = _middle(leak, 2)
    elif form in users:
        leak = base64.b64encode(f"{users[form]}:{SECRET}".encode()).decode()
        needle = _middle(leak, 6)
    elif form in streams:
        leak = base64.b64encode(b"BEGIN" + streams[form] + raw + b"END-OF-STREAM").decode()
        needle = leak[12:-20]
    elif form == "auth_basic":
        leak = "Authorization: Basic " + base64.b64encode(f"robot:{SECRET}".encode()).decode()
        needle = leak.split()[-1]
    elif form == "auth_bearer":
        leak, needle = f"authorization: Bearer {SECRET}", SECRET
    elif form == "docker_auth_json":
        b = base64.b64encode(f"robot:{SECRET}".encode()).decode()
        leak, needle = '{"auths": {"r.example": {"auth": "' + b + '"}}}', b
    else:
        leak = "Proxy-Authorization: Basic " + base64.b64encode(f"u:{SECRET}".encode()).decode()
        needle = leak.split()[-1]
    out = redact(f"line before\nsome log {leak} tail\n")
    assert needle not in out and _middle(needle, 3) not in out, out
    assert REDACTED in out and "line before" in out and "tail" in out


def test_short_cores_do_not_redact_ordinary_text():
    from domain.redact import base64_cores, register_secret

    register_secret("abcd")  # 4 characters: only the raw/whole forms, no 3-character cores
    assert all(len(c) >= 8 for c in base64_cores(b"abcd"))
    assert redact("the word YWJj appears here and abc too") == "the word YWJj appears here and abc too"


def test_redact_value_keeps_models_without_secrets_identical():
    from domain.models import PreflightCheck
    from domain.redact import redact_value, register_secret

    register_secret(SECRET)
    clean = PreflightCheck(name="n", config_key="k", ok=True, detail="nothing secret")
    assert redact_value(clean) is clean
    leaky = PreflightCheck(name="n", config_key="k", ok=True, detail=f"x {SECRET}")
    assert redact_value(leaky).detail == f"x {REDACTED}"


def test_a_credential_commands_argv_is_never_persisted(tmp_path):
    """Preflight stores the executable's name and fingerprints only (an argv may carry a secret)."""
    from activities.preflight import PreflightActivities
    from domain.config import ServiceConfig

    argv = [sys.executable, "-c", "print('cmd-secret-value-77')", "--vault-token=argv-secret-hunter2"]
    config = ServiceConfig.model_validate({
        "work_dir": str(tmp_path), "repos": {"marinskyrl_url": "file:///x", "harbor_url": "file:///y"},
        "clusters": {}, "registry": {"image_repository": "127.0.0.1:5000/x",
                                     "user": {"kind": "literal_public", "value": "u"},
                                     "token": {"kind": "command", "argv": argv}}})
    checks = []
    PreflightActivities(config)._credentials(checks)
    (check,) = [c for c in checks if c.config_key == "registry.token"]
    persisted = check.model_dump_json()
    assert check.ok and check.fingerprint and "python" in check.detail
    assert "argv-secret-hunter2" not in persisted and "cmd-secret-value-77" not in persisted
    assert "print(" not in persisted
