"""KubeEvidence against the kubectl stand-in and recorded kubectl JSON (tests/data/kube/)."""

from __future__ import annotations

import json

import pytest

from clients.kube import KubeEvidence, pod_facts
from tests.standins import KUBECTL_STANDIN, configured_kubectl

STANDIN = str(KUBECTL_STANDIN)
PREEMPTED = "iris-tester-preempted-0-5e6f7a8b-0"
OOM = "iris-tester-oom-0-9c0d1e2f-0"
PULL = "iris-tester-pull-0-3a4b5c6d-0"
SCHED = "iris-tester-sched-0-7e8f9a0b-0"


@pytest.fixture
def kube():
    return KubeEvidence(kubectl=STANDIN, timeout_s=10)


async def test_preempted_pod_condition_and_kueue_events(kube):
    facts = await kube.collect(PREEMPTED)
    assert facts.pod_found and facts.phase == "Failed"
    assert "WorkloadEvictedDueToPreempted" in facts.condition_reasons
    assert "EvictedDueToPreempted" in facts.event_reasons  # from the Workload, not the pod
    assert "QuotaReserved" not in facts.event_reasons  # another pod's workload
    assert facts.errors == []


async def test_oom_killed(kube):
    facts = await kube.collect(OOM)
    assert (facts.termination_reason, facts.exit_code) == ("OOMKilled", 137)


async def test_image_pull_backoff(kube):
    facts = await kube.collect(PULL)
    assert facts.phase == "Pending" and facts.waiting_reason == "ImagePullBackOff"
    assert "BackOff" in facts.event_reasons
    assert any("401 Unauthorized" in m for m in facts.event_messages)


async def test_failed_scheduling(kube):
    facts = await kube.collect(SCHED)
    assert "FailedScheduling" in facts.event_reasons
    assert "Unschedulable" in facts.condition_reasons


async def test_missing_pod_is_captured_not_raised(kube):
    facts = await kube.collect("iris-gone-0-00000000-0")
    assert not facts.pod_found and facts.event_reasons == []
    assert any("NotFound" in e for e in facts.errors)


async def test_missing_binary_and_timeout_are_captured(tmp_path):
    missing = KubeEvidence(kubectl=str(tmp_path / "no-kubectl"))
    assert await missing.pod(OOM) is None and await missing.events_for(OOM) == []
    assert missing.errors and all("cannot run" in e for e in missing.errors)
    slow = KubeEvidence(kubectl=configured_kubectl(tmp_path / "kubectl", KUBECTL_STANDIN_SLEEP="5"), timeout_s=0.5)
    assert await slow.pod(OOM) is None
    assert "timed out" in slow.errors[0]


async def test_argv_passes_kubeconfig_context_namespace(tmp_path):
    log = tmp_path / "argv.jsonl"
    cfg = tmp_path / "kubeconfig"
    cfg.write_text("apiVersion: v1\n")
    kubectl = configured_kubectl(tmp_path / "kubectl", KUBECTL_STANDIN_ARGV_LOG=str(log))
    kube = KubeEvidence(kubectl=kubectl, kubeconfig=str(cfg), context="cw-east", namespace="iris", timeout_s=7)
    assert (await kube.pod(OOM))["metadata"]["name"] == OOM
    argv = json.loads(log.read_text().splitlines()[0])
    assert argv == ["--kubeconfig", str(cfg), "--context", "cw-east", "--namespace", "iris",
                    "--request-timeout", "7s", "get", "pod", OOM, "-o", "json"]
    bad = KubeEvidence(kubectl=STANDIN, kubeconfig=str(tmp_path / "absent"))
    assert await bad.pod(OOM) is None and "no such file" in bad.errors[0]


def test_pod_facts_is_pure_and_lenient():
    facts = pod_facts("p", {"status": {"reason": "Evicted", "phase": "Failed"}}, [{"reason": "Evicted"}, {}])
    assert facts.status_reason == "Evicted" and facts.termination_reason is None
    assert facts.event_reasons == ["Evicted"]
