"""deploy/temporal: the Helm values for the official Temporal chart and the docker compose stack are
well-formed and agree with the image, the worker and the namespace-setup command (offline: no helm and
no docker compose on this machine, so structure and cross-references are checked)."""

from __future__ import annotations

import re
import subprocess
import tomllib
from pathlib import Path

import yaml

from runtime.namespace_setup import main as setup_namespace_main
from tests.deploy.wheel_venv import ROOT, dockerfile_stages

TEMPORAL = ROOT / "deploy" / "temporal"
NAMESPACE = "gpu-rl-builds"


def _yaml(path: Path) -> dict:
    return yaml.safe_load(path.read_text())


def _walk(node, path=()):
    if isinstance(node, dict):
        for k, v in node.items():
            yield (*path, k), v
            yield from _walk(v, (*path, k))
    elif isinstance(node, list):
        for i, v in enumerate(node):
            yield from _walk(v, (*path, i))


def test_helm_values_use_postgresql_for_persistence_and_advanced_visibility():
    values = _yaml(TEMPORAL / "helm-values.yaml")
    # Chart 1.x top-level keys only: the old subchart switches (cassandra, postgresql, elasticsearch,
    # schema.*) are rejected or ignored by it.
    assert set(values) <= {"server", "web", "admintools", "extraObjects", "serviceAccount"}
    persistence = values["server"]["config"]["persistence"]
    stores = persistence["datastores"]
    for role in ("defaultStore", "visibilityStore"):
        sql = stores[persistence[role]]["sql"]
        assert sql["pluginName"] == "postgres12"  # SQL visibility on PostgreSQL 12+ = advanced visibility
        assert sql["existingSecret"] and "password" not in sql, "passwords come from a Secret"
        assert sql["createDatabase"] is True and sql["manageSchema"] is True
    assert stores["default"]["sql"]["databaseName"] != stores["visibility"]["sql"]["databaseName"]
    assert isinstance(persistence["numHistoryShards"], int)
    (namespace,) = values["server"]["config"]["namespaces"]["namespace"]
    assert namespace["name"] == NAMESPACE and re.fullmatch(r"\d+d", namespace["retention"])
    assert values["server"]["config"]["namespaces"]["create"] is True and values["web"]["enabled"] is True


def test_compose_stack_is_consistent_with_the_image_and_the_commands():
    compose = _yaml(TEMPORAL / "compose.yaml")
    services = compose["services"]
    assert set(services) == {"postgresql", "temporal-schema", "temporal", "temporal-ui", "setup-namespace", "worker"}
    for name, service in services.items():
        for dep, cond in (service.get("depends_on") or {}).items():
            assert dep in services, f"{name} depends on unknown {dep}"
            assert cond["condition"] in {"service_started", "service_healthy", "service_completed_successfully"}
            if cond["condition"] == "service_healthy":
                assert "healthcheck" in services[dep], f"{dep} has no healthcheck for {name} to wait on"
    assert services["temporal"]["environment"]["DB"] == "postgres12"
    # Built from this repository's Dockerfile; the one-shot setup uses an entry point the wheel installs.
    build = services["setup-namespace"]["build"]
    assert ((TEMPORAL / build["context"]).resolve() / build["dockerfile"]) == ROOT / "docker" / "Dockerfile"
    assert services["worker"]["image"] == services["setup-namespace"]["image"]
    scripts = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]
    assert scripts[services["setup-namespace"]["entrypoint"][0]] == "runtime.namespace_setup:main"
    args = services["setup-namespace"]["command"]
    ctx = setup_namespace_main.make_context("setup", list(args))  # the flags really exist and parse
    assert ctx.params["temporal_namespace"] == NAMESPACE and ctx.params["create"] is True
    assert services["worker"]["depends_on"]["setup-namespace"]["condition"] == "service_completed_successfully"
    assert services["worker"]["environment"]["TEMPORAL_NAMESPACE"] == NAMESPACE
    # Grace above the image's drain; the health check asks the image's health port.
    cmd = next(c for c in dockerfile_stages()[-1] if c.cmd == "CMD")
    cmd_args = yaml.safe_load(cmd.original.split(None, 1)[1])
    drain = float(cmd_args[cmd_args.index("--graceful-shutdown") + 1])
    assert int(services["worker"]["stop_grace_period"].rstrip("s")) > drain
    health_port = cmd_args[cmd_args.index("--health") + 1].rsplit(":", 1)[1]
    assert f"127.0.0.1:{health_port}/readyz" in " ".join(services["worker"]["healthcheck"]["test"])
    config_mount = services["worker"]["volumes"][0]
    default_config = re.search(r":-([^}]+)}", config_mount).group(1)
    assert (TEMPORAL / default_config).resolve() == ROOT / "deploy" / "config.example.toml"


def test_compose_never_holds_a_password_and_every_required_variable_is_documented():
    text = (TEMPORAL / "compose.yaml").read_text()
    env_example = (TEMPORAL / "env.example").read_text()
    for key, value in _walk(_yaml(TEMPORAL / "compose.yaml")):
        if isinstance(key, str) and re.search(r"PASSWORD|PWD|TOKEN|SECRET|KEY_ID", key):
            assert str(value).startswith("${"), f"{key} must come from the environment, not the file"
    for var in set(re.findall(r"\$\{(\w+)(?::[-?])", text)):
        assert re.search(rf"^#? ?{var}=", env_example, re.M), f"{var} is not documented in env.example"


def test_the_namespace_is_the_same_everywhere():
    k8s_profiles = yaml.safe_load((ROOT / "deploy" / "k8s" / "base" / "configmap.yaml").read_text())["data"]
    team = tomllib.loads(k8s_profiles["temporal.toml"])["profile"]["team"]
    assert team["namespace"] == NAMESPACE
    assert tomllib.loads((ROOT / "deploy" / "config.example.toml").read_text())["temporal"]["namespace"] == NAMESPACE


def _default_tag(image: str) -> tuple[str, str]:
    name, _, tag = re.sub(r"\$\{\w+:-([^}]+)\}", r"\1", image).partition(":")
    return name, tag


def test_compose_runs_maintained_images_with_a_schema_job_and_a_current_ui():
    services = _yaml(TEMPORAL / "compose.yaml")["services"]
    images = {name: _default_tag(s["image"]) for name, s in services.items()}
    assert not [n for n, (image, _) in images.items() if image.endswith("auto-setup")], "auto-setup is deprecated"
    assert images["temporal"][0] == "temporalio/server" and images["temporal-schema"][0] == "temporalio/admin-tools"
    assert images["temporal"][1] == images["temporal-schema"][1], "the schema tool must match the server version"
    assert services["temporal"]["depends_on"]["temporal-schema"]["condition"] == "service_completed_successfully"
    ui = tuple(int(x) for x in images["temporal-ui"][1].split("."))
    assert images["temporal-ui"][0] == "temporalio/ui" and ui >= (2, 40), "User Metadata needs UI >= 2.40"
    env = dict(line.split("=", 1) for line in (TEMPORAL / "env.example").read_text().splitlines()
               if re.match(r"^\w+=", line))
    for service, var in (("temporal", "TEMPORAL_VERSION"), ("temporal-schema", "TEMPORAL_ADMINTOOLS_VERSION"),
                         ("temporal-ui", "TEMPORAL_UI_VERSION")):
        assert f"${{{var}:-" in services[service]["image"] and env[var] == images[service][1], var


def test_the_schema_job_is_idempotent(tmp_path):
    """The job's script as the container runs it (compose's $$ -> $), against a temporal-sql-tool stand-in
    that keeps database state in files: the first run creates and sets up both databases, the second
    (a later `docker compose up`) only updates them and still exits 0."""
    services = _yaml(TEMPORAL / "compose.yaml")["services"]
    job = services["temporal-schema"]
    assert job["entrypoint"] == ["/bin/sh", "-c"]
    script = job["command"][0].replace("$$", "$")
    state = tmp_path / "db"
    state.mkdir()
    tool = tmp_path / "bin" / "temporal-sql-tool"
    tool.parent.mkdir()
    tool.write_text(f"""#!/bin/sh
db=""; while [ $# -gt 0 ]; do case "$1" in --db) db=$2; shift;; create|setup-schema|update-schema) op=$1;; esac; shift; done
echo "$op $db" >> {state}/log
case "$op" in
  create) [ ! -e {state}/$db ] && touch {state}/$db ;;
  setup-schema) [ -e {state}/$db ] && [ ! -e {state}/$db.schema ] && touch {state}/$db.schema ;;
  update-schema) [ -e {state}/$db.schema ] ;;
esac
""")
    tool.chmod(0o755)
    env = {"PATH": f"{tool.parent}:/usr/bin:/bin", "SQL_PASSWORD": "x"}
    for run in (1, 2):
        out = subprocess.run(["/bin/sh", "-c", script], env=env, capture_output=True, text=True, timeout=30)
        assert out.returncode == 0, (run, out.stdout, out.stderr)
    log = (state / "log").read_text().split("\n")
    assert log.count("setup-schema temporal") == 1 and log.count("setup-schema temporal_visibility") == 1
    assert log.count("update-schema temporal") == 3 and "database temporal exists" in out.stdout
