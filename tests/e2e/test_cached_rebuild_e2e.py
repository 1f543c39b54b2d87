"""A rebuild after a cancel, on real parts (Temporal, the Iris controller, the registry, the fixture's script and
the kaniko stand-in with its real layer cache): the marker steps the cancelled job ran were cached, the rebuild
takes them from the cache and never prints their lines. The target ends ``cache_unproven`` naming the cached step
of each marker the hit cannot prove, with the cache bypass as its next step, not a generic ``log_lost`` (on main
before 061f7ab: log_lost, 'it carries a value', and the hint to resume, which reuses the same cache)."""

from __future__ import annotations

import pytest
from temporalio.client import WorkflowFailureError

from clients.iris import IrisClient
from sandbox.git_remotes import commit_to_remote
from tests.e2e.helpers import git_show, is_closed, report, request, start_pipeline, target_status, wait_until

pytestmark = pytest.mark.stack
KEY = "amd64-standard"
DOCKERFILE = "docker/Dockerfile.gpu-rl"


async def test_a_rebuild_from_the_cache_after_a_cancel_ends_cache_unproven_naming_the_cached_step(service_stack):
    s = service_stack
    text = git_show(s.remotes.marinskyrl_url, "main", DOCKERFILE)
    slow = text.replace('RUN echo "boto3 s3 client ctor OK', 'RUN sleep 25\nRUN echo "boto3 s3 client ctor OK', 1)
    assert slow != text
    commit_to_remote(s.remotes.marinskyrl_url, {DOCKERFILE: slow}, "a slow build step after the marker steps")
    first = await start_pipeline(s, request())

    async def sleeping():
        """The first job reached `RUN sleep 25`: every step before it ran and pushed its cache layer."""
        st = await target_status(s.client, first.id, KEY)
        if not st or not st.job_ids:
            return None
        async with IrisClient(s.iris.url, client_revision_date=s.config.clusters["sandbox-amd64"]
                              .client_revision_date) as iris:
            page = await iris.fetch_logs(f"{st.job_ids[0]}/", "prefix", substring="RUN sleep 25")
        return st.job_ids[0] if page.entries else None

    killed = await wait_until(sleeping, timeout=300, interval=1.0, what="the first job at its slow step")
    await first.cancel()
    await wait_until(lambda: is_closed(s.client, first.id), what="first run cancelled")

    second = await start_pipeline(s, request())
    with pytest.raises(WorkflowFailureError) as failed:
        await second.result()
    message = str(failed.value.cause)
    rep = await report(s.client, second.id)
    (t,) = rep.targets
    assert t.status == "failed" and killed not in t.job_ids, t
    (f,) = t.failures
    assert (f.failure_class, f.decision) == ("cache_unproven", "fail"), f
    tree = "/opt/skyrl git tree baked @"
    assert f.reasons[0].startswith("kaniko took the steps of 1 marker(s) from its cache"), f.reasons
    assert f"`{tree}" in f.reasons[0] and f"unproven (kaniko took its step from the cache: {DOCKERFILE}:" in \
        f.reasons[0], f.reasons
    assert "KANIKO_CACHE=0" in f.hint and "cache_unproven failure" in message
    check = t.log_check
    assert check is not None and check.lost_cause == "cache" and list(check.unproven) == check.missing
    assert check.missing[0].startswith(tree) and "uv sync layer 0 (small pkgs + torch) done" in check.cached
    assert "boto3 s3 client ctor OK (compute_endpoint_resolver skew cleared)" in check.found  # ran after the sleep
    assert rep.pull_request is None
