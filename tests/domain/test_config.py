import pytest

from domain.config import ConfigError, load_config

GOOD = """
work_dir = "/tmp/w"
[repos]
marinskyrl_url = "file:///r/m.git"
harbor_url = "file:///r/h.git"
[clusters.cw-rno2a]
controller_url = "http://127.0.0.1:1"
client_revision_date = "2026-11-20"
[registry]
image_repository = "127.0.0.1:5000/gpu-rl"
user = {kind = "literal_public", value = "me"}
token = {kind = "env", name = "GHCR_TOKEN"}
"""


def test_loads_the_file_only(tmp_path, monkeypatch):
    """TEMPORAL_* variables are layered by runtime.temporal.resolve_config (tests/deploy), not here."""
    p = tmp_path / "c.toml"
    p.write_text(GOOD)
    monkeypatch.setenv("TEMPORAL_ADDRESS", "temporal.example:7233")
    cfg = load_config(p)
    assert cfg.temporal.address == "localhost:7233" and cfg.temporal.namespace == "default"
    assert cfg.cluster("cw-rno2a").client_revision_date == "2026-11-20"
    with pytest.raises(ConfigError, match="cluster 'nope' is not configured"):
        cfg.cluster("nope")


def test_errors_name_file_and_field(tmp_path, monkeypatch):
    monkeypatch.delenv("GPU_RL_BUILDER_CONFIG", raising=False)
    with pytest.raises(ConfigError, match="--config"):
        load_config(None)
    p = tmp_path / "bad.toml"
    p.write_text(GOOD.replace('"2026-11-20"', '"20-11-2026"').replace("token = ", "tokn = "))
    with pytest.raises(ConfigError) as e:
        load_config(p)
    assert str(p) in str(e.value)
    assert "clusters.cw-rno2a.client_revision_date" in str(e.value) and "registry.token" in str(e.value)
    assert "YYYY-MM-DD" in str(e.value)


def test_client_revision_date_is_an_optional_override(tmp_path):
    """Unset, the client sends its marin-iris build date (clients/iris_pin.py), not a date that expires."""
    from clients.iris import IrisClient
    from clients.iris_pin import IRIS_REVISION_DATE

    p = tmp_path / "c.toml"
    p.write_text(GOOD.replace('client_revision_date = "2026-11-20"\n', ""))
    cfg = load_config(p)
    assert cfg.cluster("cw-rno2a").client_revision_date is None
    assert IrisClient("http://x", client_revision_date=None).client_revision_date == IRIS_REVISION_DATE


def test_example_config_documents_the_build_fallbacks_as_they_are():
    """deploy/config.example.toml shows the [build] defaults; it must not drift from BuildSettings."""
    from pathlib import Path

    from domain.config import BuildSettings, load_config

    example = Path(__file__).resolve().parents[2] / "deploy" / "config.example.toml"
    assert load_config(example).build == BuildSettings()


def test_registry_image_repository_is_required_naming_the_key(tmp_path):
    """The script's default repository is repository content: it never decides where the token goes."""
    from domain.config import ConfigError, load_config

    path = tmp_path / "c.toml"
    path.write_text(GOOD.replace('image_repository = "127.0.0.1:5000/gpu-rl"\n', ""))
    with pytest.raises(ConfigError, match=r"registry\.image_repository: Field required"):
        load_config(path)


@pytest.mark.parametrize("kind", ["directory", "not_utf8", "missing", "not_toml"])
def test_any_config_path_is_one_error_line(tmp_path, kind):
    from domain.config import ConfigError, load_config

    path = tmp_path / "c.toml"
    if kind == "directory":
        path.mkdir()
    elif kind == "not_utf8":
        path.write_bytes("work_dir = '\xe9'\n".encode("latin-1"))
    elif kind == "not_toml":
        path.write_text("[[[")
    with pytest.raises(ConfigError, match=str(path)) as e:
        load_config(path)
    assert "\n" not in str(e.value)


@pytest.mark.parametrize("edit,key", [
    # a file-wide check (no pydantic location): a credential over plain http to a registry that is not loopback
    (lambda t: t.replace('image_repository = "127.0.0.1:5000/gpu-rl"',
                         'image_repository = "registry.internal:5000/gpu-rl"\ninsecure_hosts = ["registry.internal:5000"]'),
     "registry.insecure_hosts = 'http://registry.internal:5000'"),
    # a field check
    (lambda t: t.replace('"2026-11-20"', '"20-11-2026"'), "clusters.cw-rno2a.client_revision_date: must be a date"),
])
def test_config_errors_name_the_key_without_pydantic_wording(tmp_path, edit, key):
    """Issue 38: '…insecure.toml: : Value error, …' had an empty location and pydantic's prefix."""
    p = tmp_path / "insecure.toml"
    p.write_text(edit(GOOD))
    with pytest.raises(ConfigError) as e:
        load_config(p)
    text = str(e.value)
    assert text.startswith(f"{p}: {key}"), text
    assert "Value error" not in text and ": : " not in text
