"""deploy/k8s: strictly valid for two Kubernetes versions, and consistent with the image and the worker
(UID/GID, probes on the health port, grace period above the drain, every mounted secret path the
configuration names exists in a Secret template, tools of the ConfigMap's configuration in the image)."""

from __future__ import annotations

import copy
import shutil
import subprocess
import tomllib
from pathlib import Path

import kubernetes_validate
import pytest
import yaml

from domain.config import load_config
from runtime.temporal import resolve_settings
from tests.deploy.wheel_venv import ROOT, dockerfile_stages

K8S = ROOT / "deploy" / "k8s"
VERSIONS = ("1.30.0", "1.37.0")
LABELS = {"app.kubernetes.io/name": "gpu-rl-builder", "app.kubernetes.io/component": "worker"}


def _docs(path: Path) -> list[dict]:
    return [d for d in yaml.safe_load_all(path.read_text()) if d]


def _manifests() -> dict[str, dict]:
    """kind/name -> resource, for the base, the Secret templates and the optional resources."""
    out = {}
    for path in [*sorted((K8S / "base").glob("*.yaml")), K8S / "secrets.example.yaml",
                 *sorted((K8S / "optional").glob("*.yaml")), *sorted((K8S / "iris").glob("*.yaml"))]:
        for doc in _docs(path):
            if doc["kind"] != "Kustomization":
                out[f"{doc['kind']}/{doc['metadata']['name']}"] = doc
    return out


def _rendered_overlay() -> list[dict]:
    kubectl = shutil.which("kubectl")
    if not kubectl:
        pytest.skip("kubectl (for its built-in kustomize) is not installed; the base is validated on its own")
    out = subprocess.run([kubectl, "kustomize", str(K8S / "overlays" / "production")], capture_output=True,
                         text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    return [d for d in yaml.safe_load_all(out.stdout) if d]


@pytest.mark.parametrize("version", VERSIONS)
def test_every_manifest_is_strictly_valid(version):
    manifests = _manifests()
    assert {"Deployment/gpu-rl-builder-worker", "PodDisruptionBudget/gpu-rl-builder-worker",
            "ServiceAccount/gpu-rl-builder-worker", "ConfigMap/gpu-rl-builder-config",
            "Secret/gpu-rl-builder-secrets", "Secret/gpu-rl-builder-temporal",
            "Secret/gpu-rl-builder-iris-kubeconfig", "PersistentVolumeClaim/gpu-rl-builder-evidence",
            "Role/gpu-rl-builder", "RoleBinding/gpu-rl-builder"} <= set(manifests)
    for doc in manifests.values():
        kubernetes_validate.validate(doc, version, strict=True)


@pytest.mark.parametrize("version", VERSIONS)
def test_rendered_overlay_is_strictly_valid_and_namespaced(version):
    docs = _rendered_overlay()
    assert {d["kind"] for d in docs} == {"ServiceAccount", "ConfigMap", "Deployment", "PodDisruptionBudget", "Service",
                                         "NetworkPolicy"}
    for doc in docs:
        kubernetes_validate.validate(doc, version, strict=True)
        assert doc["metadata"]["namespace"] == "gpu-rl-builder"


def test_strict_validation_rejects_a_misspelled_field():
    bad = copy.deepcopy(_manifests()["Deployment/gpu-rl-builder-worker"])
    bad["spec"]["template"]["spec"]["containers"][0]["livenessProbes"] = {}
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(bad, VERSIONS[0], strict=True)


def test_kustomization_lists_every_base_manifest_and_no_secret():
    kustomization = _docs(K8S / "base" / "kustomization.yaml")[0]
    files = {p.name for p in (K8S / "base").glob("*.yaml")} - {"kustomization.yaml"}
    assert set(kustomization["resources"]) == files
    assert not any(d["kind"] == "Secret" for f in files for d in _docs(K8S / "base" / f))


def _flag(args: list[str], name: str) -> str:
    return args[args.index(name) + 1]


def test_deployment_matches_the_image_and_the_worker():
    m = _manifests()
    deployment = m["Deployment/gpu-rl-builder-worker"]
    pod = deployment["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    final = dockerfile_stages()[-1]
    image_args = dict(a.value[0].split("=", 1) for a in final if a.cmd == "ARG" and "=" in a.value[0])
    security = pod["securityContext"]
    assert security["runAsNonRoot"] is True
    assert security["runAsUser"] == int(image_args["UID"]) and security["runAsGroup"] == int(image_args["GID"])
    assert security["fsGroup"] == int(image_args["GID"])
    args = container["args"]
    assert pod["terminationGracePeriodSeconds"] > float(_flag(args, "--graceful-shutdown"))
    health_port = int(_flag(args, "--health").rsplit(":", 1)[1])
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert ports["health"] == health_port and ports["metrics"] == int(_flag(args, "--metrics").rsplit(":", 1)[1])
    assert container["livenessProbe"]["httpGet"] == {"path": "/livez", "port": "health"}
    assert container["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "health"}
    assert container["startupProbe"]["httpGet"]["path"] == "/livez"
    assert pod["serviceAccountName"] in {k.split("/", 1)[1] for k in m if k.startswith("ServiceAccount/")}
    pdb = m["PodDisruptionBudget/gpu-rl-builder-worker"]
    assert pdb["spec"]["selector"]["matchLabels"].items() <= deployment["spec"]["template"]["metadata"]["labels"].items()
    assert deployment["spec"]["replicas"] > pdb["spec"]["minAvailable"]
    assert deployment["spec"]["template"]["metadata"]["labels"] == LABELS


def _mounted_files() -> dict[str, tuple[str, str]]:
    """Mounted file path -> (kind/name, key) for every key of every Secret/ConfigMap volume."""
    m = _manifests()
    pod = m["Deployment/gpu-rl-builder-worker"]["spec"]["template"]["spec"]
    mounts = {v["name"]: v["mountPath"] for v in pod["containers"][0]["volumeMounts"]}
    files = {}
    for volume in pod["volumes"]:
        if "secret" in volume:
            ref = f"Secret/{volume['secret']['secretName']}"
        elif "configMap" in volume:
            ref = f"ConfigMap/{volume['configMap']['name']}"
        else:
            continue
        assert ref in m, f"volume {volume['name']} refers to {ref}, which no manifest or template defines"
        source = m[ref]
        for key in (source.get("stringData") or source.get("data") or {}):
            files[f"{mounts[volume['name']]}/{key}"] = (ref, key)
    return files


def test_every_path_the_configuration_names_is_mounted():
    files = _mounted_files()
    config_map = _manifests()["ConfigMap/gpu-rl-builder-config"]["data"]
    named = []
    config = tomllib.loads(config_map["config.toml"])
    for section in ("registry", "github"):
        for source in config[section].values():
            if isinstance(source, dict) and source.get("kind") == "file":
                named.append(source["path"])
    named += [c["kubeconfig"] for c in config["clusters"].values()]
    for profile in tomllib.loads(config_map["temporal.toml"])["profile"].values():
        named += [p for k, p in profile.get("tls", {}).items() if k.endswith("_path")]
    env = {e["name"]: e for e in _manifests()["Deployment/gpu-rl-builder-worker"]["spec"]["template"]["spec"]
           ["containers"][0]["env"]}
    named += [env["GPU_RL_BUILDER_CONFIG"]["value"], env["TEMPORAL_CONFIG_FILE"]["value"]]
    assert len(named) >= 8
    for path in named:
        assert path in files, f"{path} is named by the configuration but no volume provides it"
    ref = env["TEMPORAL_API_KEY"]["valueFrom"]["secretKeyRef"]
    assert ref["key"] in _manifests()[f"Secret/{ref['name']}"]["stringData"]


def test_configmap_configuration_loads_and_its_profiles_resolve(tmp_path, wheel_venv):
    data = _manifests()["ConfigMap/gpu-rl-builder-config"]["data"]
    (tmp_path / "config.toml").write_text(data["config.toml"])
    (tmp_path / "temporal.toml").write_text(data["temporal.toml"])
    config = load_config(tmp_path / "config.toml")
    env = {"TEMPORAL_CONFIG_FILE": str(tmp_path / "temporal.toml"), "TEMPORAL_API_KEY": "k"}
    cloud = resolve_settings(config.temporal, env={**env, "TEMPORAL_PROFILE": "cloud"})
    assert cloud.address.endswith(".tmprl.cloud:7233") and cloud.tls and cloud.api_key.name == "TEMPORAL_API_KEY"
    team = resolve_settings(config.temporal, env={"TEMPORAL_CONFIG_FILE": env["TEMPORAL_CONFIG_FILE"],
                                                  "TEMPORAL_PROFILE": "team"})
    assert team.tls_client_cert_path == "/var/run/secrets/temporal/tls.crt" and team.api_key is None
    incluster = resolve_settings(config.temporal, env={"TEMPORAL_CONFIG_FILE": env["TEMPORAL_CONFIG_FILE"],
                                                       "TEMPORAL_PROFILE": "team-incluster"})
    assert incluster.address == "temporal-frontend.temporal.svc:7233" and incluster.tls is False
    ran = wheel_venv.run("gpu-rl-builder-worker", "--config", str(tmp_path / "config.toml"), "--check-tools")
    assert ran.returncode == 0, ran.stderr


def test_each_identity_comes_from_its_own_credential():
    """The registry user is the owner of the registry token, read with that token — no other secret
    (e.g. the GitHub token as GH_TOKEN) reaches a tool that would answer for it."""
    data = _manifests()["ConfigMap/gpu-rl-builder-config"]["data"]
    config = tomllib.loads(data["config.toml"])
    example = tomllib.loads((ROOT / "deploy" / "config.example.toml").read_text())
    for registry in (config["registry"], example["registry"]):
        assert registry["user"] == {"kind": "token_owner"} and registry["token"]["path"].endswith("/ghcr-token")
    (container,) = _manifests()["Deployment/gpu-rl-builder-worker"]["spec"]["template"]["spec"]["containers"]
    from_secrets = {e["name"]: e["valueFrom"]["secretKeyRef"]["key"] for e in container["env"] if "valueFrom" in e}
    # The payload codec's keys and the codec server's operator token (runtime/payload_codec.py): neither is
    # an identity a tool could answer for, and child processes get an allow-listed environment.
    assert from_secrets == {"TEMPORAL_API_KEY": "api-key", "GPU_RL_BUILDER_CODEC_KEYS": "keys",
                            "GPU_RL_BUILDER_CODEC_TOKEN": "operator-token"}, from_secrets
    compose = yaml.safe_load((ROOT / "deploy" / "temporal" / "compose.yaml").read_text())
    assert not {"GH_TOKEN", "GITHUB_TOKEN"} & set(compose["services"]["worker"]["environment"])


def _allows(rules: list[dict], group: str, resource: str, verb: str, name: str | None = None) -> bool:
    return any(group in r["apiGroups"] and resource in r["resources"] and verb in r["verbs"]
               and (not r.get("resourceNames") or name in r["resourceNames"]) for r in rules)


def test_the_iris_role_grants_what_the_worker_runs_there_and_nothing_else():
    """deploy/k8s/iris/rbac.yaml, applied on each Iris cluster: the kubectl calls of clients/kube.py
    (port-forward to the controller Service, pod and event reads) in namespace iris, read-only."""
    m = _manifests()
    role, binding = m["Role/gpu-rl-builder"], m["RoleBinding/gpu-rl-builder"]
    config = tomllib.loads(m["ConfigMap/gpu-rl-builder-config"]["data"]["config.toml"])
    forwards = {(c["port_forward"]["namespace"], c["port_forward"]["service"]) for c in config["clusters"].values()}
    assert forwards == {("iris", "iris-controller-svc")} and role["metadata"]["namespace"] == "iris"
    rules = role["rules"]
    assert _allows(rules, "", "services", "get", "iris-controller-svc")
    assert _allows(rules, "", "pods", "list") and _allows(rules, "", "pods/portforward", "create")
    assert _allows(rules, "", "pods", "get") and _allows(rules, "", "events", "list")
    writes = {"create", "update", "patch", "delete", "deletecollection", "*"}
    assert not [r for r in rules if writes & set(r["verbs"]) and r["resources"] != ["pods/portforward"]]
    assert not _allows(rules, "", "secrets", "get") and not _allows(rules, "", "pods/exec", "create")
    assert binding["roleRef"] == {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "gpu-rl-builder"}
    assert binding["metadata"]["namespace"] == "iris"


def test_example_kube_contexts_are_marin_iris_own():
    """The contexts of the example configurations are those of marin-iris's cluster configs
    (iris/config/<cluster>.yaml, platform.coreweave.kube_context) when that package is installed."""
    iris_config = Path(__import__("iris").__file__).parent / "config"
    for text in (_manifests()["ConfigMap/gpu-rl-builder-config"]["data"]["config.toml"],
                 (ROOT / "deploy" / "config.example.toml").read_text()):
        for name, cluster in tomllib.loads(text)["clusters"].items():
            upstream = iris_config / f"{name}.yaml"
            if not upstream.exists():
                pytest.skip(f"{upstream} is not in the installed marin-iris")
            platform = yaml.safe_load(upstream.read_text())["platform"]["coreweave"]
            assert cluster["kube_context"] == platform["kube_context"], name
            assert cluster["port_forward"]["namespace"] == platform["namespace"]


def test_the_worker_pod_can_rehearse_and_the_configuration_requires_it():
    """policy.rehearsal = "required" ships with a pod that keeps the runtime's default profiles (Pod
    Security baseline and restricted admit it: tests/deploy/test_pod_security.py); the rehearsal isolates
    there under proot (deploy/README.md, Rehearsal). bwrap's settings live only in overlays/bwrap."""
    m = _manifests()
    pod = m["Deployment/gpu-rl-builder-worker"]["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    config = tomllib.loads(m["ConfigMap/gpu-rl-builder-config"]["data"]["config.toml"])
    assert config["policy"]["rehearsal"] == "required"
    assert tomllib.loads((ROOT / "deploy" / "config.example.toml").read_text())["policy"]["rehearsal"] == "required"
    assert "hostUsers" not in pod and "procMount" not in container["securityContext"]
    assert pod["securityContext"]["seccompProfile"]["type"] == "RuntimeDefault"
    assert "appArmorProfile" not in pod["securityContext"]
    sc = container["securityContext"]
    assert sc["allowPrivilegeEscalation"] is False and sc["capabilities"] == {"drop": ["ALL"]}
    assert sc["readOnlyRootFilesystem"] is True and pod["securityContext"]["runAsNonRoot"] is True
    assert "privileged" not in sc and "add" not in sc["capabilities"]
    readme = (ROOT / "deploy" / "README.md").read_text()
    section = readme[readme.index("- **Rehearsal**"):readme.index("- **Bumping pinned tools**")]
    for setting in ("proot", "Landlock", "Linux ≥ 6.12", "hostUsers: false", "procMount: Unmasked",
                    "seccompProfile: Unconfined", "appArmorProfile: Unconfined", 'policy.rehearsal = "required"',
                    "best_effort", "overlays/bwrap", "overlays/openshift"):
        assert setting in section, setting


@pytest.mark.parametrize("version", VERSIONS)
def test_the_rehearsal_settings_are_strictly_valid_and_a_misplaced_one_is_not(version):
    deployment = copy.deepcopy(_manifests()["Deployment/gpu-rl-builder-worker"])
    kubernetes_validate.validate(deployment, version, strict=True)
    pod = deployment["spec"]["template"]["spec"]
    pod["containers"][0]["securityContext"]["hostUsers"] = False  # a pod field, not a container's
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(deployment, version, strict=True)
