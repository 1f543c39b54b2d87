"""The shipped worker pod and each overlay under the Pod Security level it claims (tests/deploy/pod_security.py):
the base is admitted under "baseline" and "restricted" and still requires the rehearsal; each overlay renders
with kubectl's kustomize, is strictly valid and is admitted at its level; every check refuses a pod that
breaks it (so an admission here is not a check that cannot fail)."""

from __future__ import annotations

import copy
import shutil
import subprocess
import tomllib

import kubernetes_validate
import pytest
import yaml

from tests.deploy import pod_security as pss
from tests.deploy.wheel_venv import ROOT

K8S = ROOT / "deploy" / "k8s"
# overlay -> (the level it claims, the strictest level that must refuse it or None)
OVERLAYS = {"production": ("restricted", None), "openshift": ("restricted", None), "bwrap": ("privileged", "baseline")}
VERSIONS = ("1.30.0", "1.37.0")


def _base_pod() -> tuple[dict, dict]:
    docs = [d for d in yaml.safe_load_all((K8S / "base" / "deployment.yaml").read_text()) if d]
    (dep,) = [d for d in docs if d["kind"] == "Deployment"]
    return pss.pod_template(dep)


def _render(overlay: str) -> list[dict]:
    kubectl = shutil.which("kubectl")
    assert kubectl, "kubectl (its built-in kustomize) is needed to render the overlays (scripts/bootstrap)"
    out = subprocess.run([kubectl, "kustomize", str(K8S / "overlays" / overlay)], capture_output=True, text=True,
                         timeout=60)
    assert out.returncode == 0, out.stderr
    return [d for d in yaml.safe_load_all(out.stdout) if d]


@pytest.mark.parametrize("level", ["baseline", "restricted"])
def test_the_shipped_deployment_is_admitted(level):
    pod, annotations = _base_pod()
    assert pss.violations(level, pod, annotations) == []


def test_the_shipped_configuration_still_requires_the_rehearsal_and_isolation_is_auto():
    docs = {d["kind"]: d for d in yaml.safe_load_all((K8S / "base" / "configmap.yaml").read_text()) if d}
    policy = tomllib.loads(docs["ConfigMap"]["data"]["config.toml"])["policy"]
    assert policy["rehearsal"] == "required"
    assert policy.get("rehearsal_isolation", "auto") == "auto"  # bwrap where it runs, else proot


@pytest.mark.parametrize("overlay", sorted(OVERLAYS))
def test_each_overlay_renders_validates_and_is_admitted_at_its_level(overlay):
    level, refused_by = OVERLAYS[overlay]
    docs = _render(overlay)
    for doc in docs:
        for version in VERSIONS:
            kubernetes_validate.validate(doc, version, strict=True)
    (dep,) = [d for d in docs if d["kind"] == "Deployment"]
    pod, annotations = pss.pod_template(dep)
    assert pss.violations(level, pod, annotations) == [], overlay
    if refused_by:
        assert pss.violations(refused_by, pod, annotations), f"{overlay} claims {level} but {refused_by} admits it"
    else:
        assert level == "restricted"


def test_the_openshift_overlay_takes_its_uid_from_the_namespace_range():
    (dep,) = [d for d in _render("openshift") if d["kind"] == "Deployment"]
    psc = dep["spec"]["template"]["spec"]["securityContext"]
    assert not {"runAsUser", "runAsGroup", "fsGroup"} & set(psc) and psc["runAsNonRoot"] is True
    for c in dep["spec"]["template"]["spec"]["containers"]:
        assert "runAsUser" not in (c.get("securityContext") or {})


def test_the_bwrap_overlay_gives_bwrap_what_it_needs():
    (dep,) = [d for d in _render("bwrap") if d["kind"] == "Deployment"]
    pod = dep["spec"]["template"]["spec"]
    assert pod["hostUsers"] is False and pod["securityContext"]["seccompProfile"]["type"] == "Unconfined"
    assert pod["securityContext"]["appArmorProfile"]["type"] == "Unconfined"
    assert pod["containers"][0]["securityContext"]["procMount"] == "Unmasked"


# Each mutation breaks one check; the level at which it must be refused, and the check's name.
BREAKS = [
    ("baseline", "hostNamespaces", lambda p: p.update(hostNetwork=True)),
    ("baseline", "hostNamespaces", lambda p: p.update(hostPID=True)),
    ("baseline", "privileged", lambda p: p["containers"][0]["securityContext"].update(privileged=True)),
    ("baseline", "capabilities_baseline",
     lambda p: p["containers"][0]["securityContext"]["capabilities"].update(add=["SYS_ADMIN"])),
    ("baseline", "hostPathVolumes", lambda p: p["volumes"].append({"name": "h", "hostPath": {"path": "/"}})),
    ("baseline", "hostPorts", lambda p: p["containers"][0]["ports"].append({"containerPort": 1, "hostPort": 1})),
    ("baseline", "procMount", lambda p: p["containers"][0]["securityContext"].update(procMount="Unmasked")),
    ("baseline", "seccompProfile_baseline",
     lambda p: p["securityContext"].update(seccompProfile={"type": "Unconfined"})),
    ("baseline", "appArmorProfile", lambda p: p["securityContext"].update(appArmorProfile={"type": "Unconfined"})),
    ("baseline", "seLinuxOptions", lambda p: p["securityContext"].update(seLinuxOptions={"type": "spc_t"})),
    ("baseline", "sysctls", lambda p: p["securityContext"].update(sysctls=[{"name": "kernel.msgmax", "value": "1"}])),
    ("baseline", "hostProcess",
     lambda p: p["securityContext"].update(windowsOptions={"hostProcess": True})),
    ("baseline", "hostProbesAndHostLifecycle",
     lambda p: p["containers"][0].update(readinessProbe={"tcpSocket": {"host": "10.0.0.1", "port": 80}})),
    ("baseline", "hostProbesAndHostLifecycle",
     lambda p: p["containers"][0].update(lifecycle={"preStop": {"httpGet": {"host": "x.example", "port": 80}}})),
    ("restricted", "procMount_restricted",  # baseline lets a user-namespaced pod unmask /proc; restricted never
     lambda p: (p.update(hostUsers=False), p["containers"][0]["securityContext"].update(procMount="Unmasked"))),
    ("restricted", "restrictedVolumes", lambda p: p["volumes"].append({"name": "n", "nfs": {"server": "x", "path": "/"}})),
    ("restricted", "allowPrivilegeEscalation",
     lambda p: p["containers"][0]["securityContext"].pop("allowPrivilegeEscalation")),
    ("restricted", "runAsNonRoot", lambda p: p["securityContext"].pop("runAsNonRoot")),
    ("restricted", "runAsUser", lambda p: p["securityContext"].update(runAsUser=0)),
    ("restricted", "seccompProfile_restricted", lambda p: p["securityContext"].pop("seccompProfile")),
    ("restricted", "capabilities_restricted",
     lambda p: p["containers"][0]["securityContext"]["capabilities"].update(drop=["NET_RAW"])),
    ("restricted", "capabilities_restricted",
     lambda p: p["containers"][0]["securityContext"]["capabilities"].update(add=["CHOWN"])),
]


@pytest.mark.parametrize("level,check,mutate", BREAKS, ids=[f"{b[1]}-{i}" for i, b in enumerate(BREAKS)])
def test_every_check_refuses_a_pod_that_breaks_it(level, check, mutate):
    pod, annotations = _base_pod()
    pod = copy.deepcopy(pod)
    mutate(pod)
    found = pss.violations(level, pod, annotations)
    assert any(v.startswith(check + ":") for v in found), found
    if level == "restricted":
        assert pss.violations("baseline", pod, annotations) == [], "a restricted-only rule leaked into baseline"


def test_an_apparmor_annotation_other_than_runtime_default_is_refused():
    pod, _ = _base_pod()
    bad = {"container.apparmor.security.beta.kubernetes.io/worker": "unconfined"}
    assert any(v.startswith("appArmorProfile:") for v in pss.violations("baseline", pod, bad))
    assert pss.violations("baseline", pod, {"container.apparmor.security.beta.kubernetes.io/worker":
                                            "runtime/default"}) == []


def test_a_windows_pod_is_exempt_from_exactly_the_three_linux_only_restricted_checks():
    pod, annotations = _base_pod()
    pod = copy.deepcopy(pod)
    pod["securityContext"].pop("seccompProfile", None)
    for c in pod["containers"]:
        c["securityContext"].pop("allowPrivilegeEscalation", None)
        c["securityContext"]["capabilities"]["drop"] = []
    linux = {v.split(":")[0] for v in pss.violations("restricted", pod, annotations)}
    assert linux == {"allowPrivilegeEscalation", "seccompProfile_restricted", "capabilities_restricted"}
    pod["os"] = {"name": "windows"}
    assert pss.violations("restricted", pod, annotations) == []
    pod["securityContext"]["runAsUser"] = 0  # not one of the three: still refused for Windows
    assert [v.split(":")[0] for v in pss.violations("restricted", pod, annotations)] == ["runAsUser"]
