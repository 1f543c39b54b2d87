"""Best-effort Kubernetes evidence for a failed Iris task: its pod and the events about it.

Why best-effort: evidence only refines a failure classification. Every kubectl call is bounded by a
timeout, and errors (no kubectl, no access, pod already gone) are recorded in ``errors`` instead of
raised, so a missing cluster credential never turns into a failed build decision.

Kueue preemption is reported on the pod's *Workload* object (``pod-<pod name>-<hash>``), not on the
pod itself, so ``events_for`` also reads the namespace's Workload events and keeps those whose
object name starts with ``pod-<pod name>``.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import socket

from pydantic import BaseModel, ConfigDict, Field

from clients.child_env import KUBECTL, child_env
from clients.iris import Unavailable


class PodFacts(BaseModel):
    """What a pod and its events say about why a task ended (all optional)."""

    model_config = ConfigDict(frozen=True)

    pod_name: str
    pod_found: bool = False
    phase: str | None = None
    status_reason: str | None = None  # pod.status.reason, e.g. Evicted
    termination_reason: str | None = None  # containerStatuses[].state.terminated.reason, e.g. OOMKilled
    exit_code: int | None = None
    waiting_reason: str | None = None  # e.g. ImagePullBackOff
    condition_reasons: list[str] = Field(default_factory=list)  # e.g. WorkloadEvictedDueToPreempted
    event_reasons: list[str] = Field(default_factory=list)  # e.g. FailedScheduling, EvictedDueToPreempted
    event_messages: list[str] = Field(default_factory=list)
    errors: list[str] = Field(default_factory=list)  # kubectl problems met while collecting


def pod_facts(pod_name: str, pod: dict | None, events: list[dict], errors: list[str] = ()) -> PodFacts:
    """Pure extraction of the fields a classifier needs from ``kubectl get pod/events -o json``."""
    facts: dict = {"pod_name": pod_name, "pod_found": pod is not None, "errors": list(errors)}
    if pod:
        status = pod.get("status") or {}
        facts["phase"] = status.get("phase")
        facts["status_reason"] = status.get("reason")
        for cs in status.get("containerStatuses") or []:
            state = cs.get("state") or {}
            last = cs.get("lastState") or {}
            terminated = state.get("terminated") or last.get("terminated")
            if terminated and facts.get("termination_reason") is None:
                facts["termination_reason"] = terminated.get("reason")
                facts["exit_code"] = terminated.get("exitCode")
            if state.get("waiting") and facts.get("waiting_reason") is None:
                facts["waiting_reason"] = state["waiting"].get("reason")
        facts["condition_reasons"] = [
            c["reason"] for c in status.get("conditions") or [] if c.get("reason") and c.get("status") != "Unknown"
        ]
    facts["event_reasons"] = [e.get("reason") for e in events if e.get("reason")]
    facts["event_messages"] = [e.get("message") for e in events if e.get("message")][:20]
    return PodFacts(**facts)


async def _run_bounded(argv: list[str], timeout_s: float) -> tuple[int, bytes, bytes]:
    """Run ``argv`` in its own process group, no stdin; ``(returncode, stdout, stderr)``. Past ``timeout_s``
    the whole group is killed and reaped, then ``TimeoutError``; ``OSError`` when it cannot start.
    kubectl gets the allow-listed environment (clients/child_env.py), not the worker's credentials."""
    proc = await asyncio.create_subprocess_exec(*argv, stdin=asyncio.subprocess.DEVNULL,
                                                stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
                                                start_new_session=True, env=child_env(allow=KUBECTL))
    try:
        out, err = await asyncio.wait_for(proc.communicate(), timeout_s)
    except TimeoutError:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        await proc.wait()
        raise
    return proc.returncode, out, err


class KubeEvidence:
    """Reads pods and events with the ``kubectl`` binary (bounded, errors captured in ``errors``)."""

    def __init__(self, kubectl: str = "kubectl", kubeconfig: str | None = None, context: str | None = None,
                 namespace: str = "iris", timeout_s: float = 20.0):
        self.kubectl = kubectl
        self.kubeconfig = kubeconfig
        self.context = context
        self.namespace = namespace
        self.timeout_s = timeout_s
        self.errors: list[str] = []

    def argv(self, *args: str) -> list[str]:
        argv = [self.kubectl]
        if self.kubeconfig:
            argv += ["--kubeconfig", os.path.expanduser(self.kubeconfig)]
        if self.context:
            argv += ["--context", self.context]
        return [*argv, "--namespace", self.namespace, "--request-timeout", f"{int(self.timeout_s)}s", *args]

    async def _json(self, *args: str) -> dict | None:
        try:
            rc, out, err = await _run_bounded(self.argv(*args), self.timeout_s)
        except TimeoutError:  # before OSError, whose subclass it is
            self.errors.append(f"{' '.join(args)}: timed out after {self.timeout_s}s")
            return None
        except OSError as e:
            self.errors.append(f"{' '.join(args)}: cannot run {self.kubectl}: {e.strerror}")
            return None
        if rc != 0:
            self.errors.append(f"{' '.join(args)}: {err.decode(errors='replace').strip()[-500:]}")
            return None
        try:
            return json.loads(out)
        except ValueError:
            self.errors.append(f"{' '.join(args)}: output is not JSON")
            return None

    async def pod(self, pod_name: str) -> dict | None:
        """``kubectl get pod <name> -o json``; None when absent or unreadable."""
        return await self._json("get", "pod", pod_name, "-o", "json")

    async def events_for(self, pod_name: str) -> list[dict]:
        """Events about the pod plus Kueue events about its Workload, oldest first."""
        pod_events = await self._json("get", "events", "--field-selector", f"involvedObject.name={pod_name}",
                                      "-o", "json")
        workload_events = await self._json("get", "events", "--field-selector", "involvedObject.kind=Workload",
                                           "-o", "json")
        items = list((pod_events or {}).get("items") or [])
        items += [e for e in (workload_events or {}).get("items") or []
                  if ((e.get("involvedObject") or {}).get("name") or "").startswith(f"pod-{pod_name}")]
        return sorted(items, key=lambda e: e.get("lastTimestamp") or e.get("eventTime") or "")

    async def collect(self, pod_name: str) -> PodFacts:
        """Pod + events, reduced to ``PodFacts`` (errors included)."""
        start = len(self.errors)
        pod = await self.pod(pod_name)
        events = await self.events_for(pod_name)
        return pod_facts(pod_name, pod, events, self.errors[start:])


class KubectlUnavailable(RuntimeError):
    """The configured kubectl binary cannot be run (missing, not executable, failing or hanging)."""


async def kubectl_client_version(kubectl: str = "kubectl", timeout_s: float = 20.0) -> str:
    """``kubectl version --client -o json`` → the client's gitVersion (preflight: the tool runs here)."""
    try:
        rc, out, err = await _run_bounded([kubectl, "version", "--client", "-o", "json"], timeout_s)
    except TimeoutError:  # before OSError, whose subclass it is
        raise KubectlUnavailable(f"{kubectl} version timed out after {timeout_s}s") from None
    except OSError as e:
        raise KubectlUnavailable(f"cannot run {kubectl}: {e.strerror}") from None
    if rc != 0:
        raise KubectlUnavailable(f"{kubectl} version exited {rc}: "
                                 f"{err.decode(errors='replace').strip()[-300:]}")
    try:
        return str((json.loads(out).get("clientVersion") or {}).get("gitVersion") or "unknown")
    except (ValueError, AttributeError):
        raise KubectlUnavailable(f"{kubectl} version printed no JSON") from None


# ------------------------------------------------------------------------- port-forward to a controller
def _free_local_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class KubectlPortForward:
    """``async with KubectlPortForward(...) as url:`` runs ``kubectl port-forward`` to the controller
    Service on a free 127.0.0.1 port for the length of the block and yields ``http://127.0.0.1:<p>``."""

    def __init__(self, kubeconfig: str | None, context: str | None, namespace: str = "iris",
                 service: str = "iris-controller-svc", port: int = 10000, *, kubectl: str = "kubectl",
                 local_port: int | None = None, ready_timeout_s: float = 30.0):
        self.kubeconfig = kubeconfig
        self.context = context
        self.namespace = namespace
        self.service = service
        self.port = port
        self.kubectl = kubectl
        self.local_port = local_port
        self.ready_timeout_s = ready_timeout_s
        self._proc: asyncio.subprocess.Process | None = None

    def argv(self, local_port: int) -> list[str]:
        argv = [self.kubectl]
        if self.kubeconfig:
            argv += ["--kubeconfig", os.path.expanduser(self.kubeconfig)]
        if self.context:
            argv += ["--context", self.context]
        return argv + ["--namespace", self.namespace, "port-forward", "--address", "127.0.0.1",
                       f"svc/{self.service}", f"{local_port}:{self.port}"]

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.local_port}"

    async def __aenter__(self) -> str:
        self.local_port = self.local_port or _free_local_port()
        self._proc = await asyncio.create_subprocess_exec(
            *self.argv(self.local_port), stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.STDOUT, start_new_session=True, env=child_env(allow=KUBECTL))
        try:
            await asyncio.wait_for(self._wait_ready(), self.ready_timeout_s)
        except BaseException:
            await self.aclose()
            raise
        return self.url

    async def _wait_ready(self) -> None:
        assert self._proc and self._proc.stdout
        seen: list[str] = []
        while True:
            line = (await self._proc.stdout.readline()).decode(errors="replace")
            if not line:
                raise Unavailable("port-forward", "transport",
                                  f"kubectl port-forward exited: {' | '.join(seen[-3:]) or 'no output'}")
            seen.append(line.strip())
            if line.startswith("Forwarding from"):
                asyncio.get_running_loop().create_task(self._drain())
                return

    async def _drain(self) -> None:
        """Keep reading kubectl's output so it never blocks on a full pipe."""
        try:
            while self._proc and self._proc.stdout and await self._proc.stdout.readline():
                pass
        except (OSError, ValueError):
            pass

    async def aclose(self) -> None:
        proc, self._proc = self._proc, None
        if proc is None or proc.returncode is not None:
            return
        try:
            os.killpg(proc.pid, signal.SIGTERM)
        except ProcessLookupError:
            return
        try:
            await asyncio.wait_for(proc.wait(), 5)
        except TimeoutError:
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            await proc.wait()

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()
